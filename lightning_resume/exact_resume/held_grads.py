"""Gradients a save holds because the next step uses them (inside an accumulation window, or
``StochasticWeightAveraging``'s BatchNorm epoch): saved with the rank's state and put back."""

from __future__ import annotations

import torch


def capture(module: torch.nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().cpu().clone() for p in module.parameters()]


def restore(module: torch.nn.Module, grads: list[torch.Tensor | None]) -> bool:
    """Put back what :func:`capture` returned; ``False`` (nothing changed) when the parameters differ."""
    parameters = list(module.parameters())
    if len(parameters) != len(grads) or any(
        g is not None and g.shape != p.shape for p, g in zip(parameters, grads, strict=True)
    ):
        return False
    for parameter, grad in zip(parameters, grads, strict=True):
        parameter.grad = None if grad is None else grad.to(parameter.device, parameter.dtype)
    return True
