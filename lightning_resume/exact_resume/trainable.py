"""Module state outside the state_dict, saved and put back: which parameters are trainable, which
submodules are in eval mode, which norm layers track no running statistics. A callback that changes
them in ``setup`` or at an epoch's start (``BaseFinetuning`` freezes a backbone, turns
``track_running_stats`` off on its BatchNorm layers, and undoes both at a milestone) would otherwise
leave a mid-epoch resume in its first-epoch state."""

from __future__ import annotations

from typing import Any, TypedDict

import torch

from lightning_resume.exact_resume.self_check import untracked_norms


class Modes(TypedDict):
    """The submodules in eval mode and the norm layers not tracking running stats, by name."""

    eval: list[str]
    untracked: list[str]


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


def modes(module: torch.nn.Module, training: dict[str, bool] | None = None) -> Modes:
    """``module``'s modes; ``training``: each submodule's ``training`` flag to record instead (inside a
    validation, the modes it will give back)."""
    flags = training if training is not None else {n: m.training for n, m in module.named_modules()}
    return {"eval": [name for name, on in flags.items() if not on], "untracked": untracked_norms(module)}


def put_back_modes(module: torch.nn.Module, saved: Any) -> list[str]:
    """Set every submodule's mode and ``track_running_stats`` as ``saved`` (when every name is a
    submodule of ``module``); the names whose setting changed."""
    if not isinstance(saved, dict):
        return []
    submodules = dict(module.named_modules())
    off, untracked = set(saved.get("eval", ())), set(saved.get("untracked", ()))
    if not off.union(untracked) <= submodules.keys():
        return []
    changed = []
    for name, sub in submodules.items():
        if sub.training == (name in off):
            sub.training = name not in off  # this module only: its children have their own entries
            changed.append(name)
        tracks = getattr(sub, "track_running_stats", None)
        if isinstance(tracks, bool) and tracks == (name in untracked):
            sub.track_running_stats = name not in untracked
            changed.append(name)
    return changed
