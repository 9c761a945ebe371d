"""Which parameters are trainable, saved and put back: a callback that freezes in ``setup`` and
unfreezes at an epoch's start (``BaseFinetuning``) would leave a mid-epoch resume frozen."""

from __future__ import annotations

import torch


def frozen(module: torch.nn.Module) -> list[str]:
    """The names of the parameters that do not require gradients."""
    return [name for name, p in module.named_parameters() if not p.requires_grad]


def put_back(module: torch.nn.Module, names: list[str]) -> list[str]:
    """Make exactly ``names`` frozen (when every one is a parameter of ``module``); the names whose
    setting changed."""
    parameters = dict(module.named_parameters())
    if any(name not in parameters for name in names):
        return []
    wanted = set(names)
    changed = [name for name, p in parameters.items() if p.requires_grad == (name in wanted)]
    for name in changed:
        parameters[name].requires_grad_(name not in wanted)
    return changed
