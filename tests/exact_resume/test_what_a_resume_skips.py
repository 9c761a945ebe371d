"""The states a resume would otherwise lose: which parameters are trainable, held gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_job, same_weights, uninterrupted
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


@pytest.mark.long
def test_a_preemption_inside_an_accumulation_window_keeps_its_gradients(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """SIGTERM as step 4's window starts: the save after its first of 3 batches holds that gradient."""
    args = ("--loader", "plain", "--accumulate", "3", "--preemption")
    reference = uninterrupted(tmp_path_factory, "accumulate-3-preemption", *args)
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(root, out, *args, "--signal-at", "4", LIGHTNING_RESUME_KEY="window")
    assert first.returncode == 143, first.output
    (last,) = root.glob("*/*/*/checkpoints/last.ckpt")
    state = torch.load(last, weights_only=False)
    assert state["global_step"] == 4 and state["callbacks"]["ExactResume"]["ranks"][0].get("grads")
    again = run_job(root, out, *args, LIGHTNING_RESUME_KEY="window")
    assert again.returncode == 0, again.output
    assert "resume self-check after step 4: exact" in again.output
    assert same_weights(out, reference)
