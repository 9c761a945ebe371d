"""The states a resume would otherwise lose: which parameters are trainable, held gradients."""

from __future__ import annotations

import torch
from torch import nn

from lightning_resume.exact_resume import held_grads, trainable


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))


def test_requires_grad_comes_back_by_name() -> None:
    saved = model()
    saved[0].requires_grad_(False)
    again = model()  # a setup hook froze the head instead
    again[1].requires_grad_(False)
    changed = trainable.put_back(again, trainable.frozen(saved))
    assert sorted(changed) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert [p.requires_grad for p in again.parameters()] == [False, False, True, True]
    assert trainable.put_back(again, ["no.such.parameter"]) == []  # another model: left alone


def test_held_gradients_come_back_and_the_next_backward_adds_to_them() -> None:
    torch.manual_seed(0)
    net, x = model(), torch.randn(5, 3)
    net(x).sum().backward()
    grads = held_grads.capture(net)
    net(x).sum().backward()
    expected = [p.grad.clone() for p in net.parameters()]  # type: ignore[union-attr]

    again = model()
    again.load_state_dict(net.state_dict())
    assert held_grads.restore(again, grads)
    again(x).sum().backward()
    assert all(torch.equal(p.grad, e) for p, e in zip(again.parameters(), expected, strict=True))
    assert not held_grads.restore(nn.Linear(3, 4), grads)  # other parameters: nothing changed
