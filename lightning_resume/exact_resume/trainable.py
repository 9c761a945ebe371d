"""Module state outside the state_dict, saved and put back: trainable parameters, submodules in eval mode,
norm layers tracking no running statistics (``BaseFinetuning`` sets them in hooks a resume skips)."""

from __future__ import annotations

from typing import Any, TypedDict

import torch

from lightning_resume.exact_resume.self_check import untracked_norms


class Modes(TypedDict):
    """The submodules in eval mode and the norm layers not tracking running stats, by name."""

    eval: list[str]
    untracked: list[str]


def frozen(module: torch.nn.Module) -> list[str]:
    return [name for name, p in module.named_parameters() if not p.requires_grad]


def put_back(module: torch.nn.Module, names: list[str]) -> list[str]:
    """Make exactly ``names`` frozen (if all are ``module``'s parameters); the names whose setting changed."""
    parameters = dict(module.named_parameters())
    if any(name not in parameters for name in names):
        return []
    wanted = set(names)
    changed = [name for name, p in parameters.items() if p.requires_grad == (name in wanted)]
    for name in changed:
        parameters[name].requires_grad_(name not in wanted)
    return changed


def modes(module: torch.nn.Module, training: dict[str, bool] | None = None) -> Modes:
    """``module``'s modes, or those of the ``training`` flags given (in a validation: those it gives back)."""
    flags = training if training is not None else {n: m.training for n, m in module.named_modules()}
    return {"eval": [name for name, on in flags.items() if not on], "untracked": untracked_norms(module)}


def put_back_modes(module: torch.nn.Module, saved: Any) -> list[str]:
    """Set each submodule's mode and ``track_running_stats`` as ``saved`` (all names known); those changed."""
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
