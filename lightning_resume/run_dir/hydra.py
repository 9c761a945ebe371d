"""Hydra's output dir of this launch, and whether a runs root inside it survives a restart (Hydra gives
each local launch a new output dir; only hydra-submitit-launcher keeps it across requeues)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HydraLaunch:
    """What Hydra decided for this launch."""

    output_dir: Path  # ``hydra.runtime.output_dir``
    chdir: bool  # ``hydra.job.chdir``: the output dir is the working dir
    launcher: str  # the launcher's ``_target_``
    config_file: Path | None = None  # the composed configuration it saved (``.hydra/config.yaml``), if any


def current_launch() -> HydraLaunch | None:
    """This process's Hydra launch, or ``None`` outside a ``@hydra.main`` application."""
    if "hydra.core.hydra_config" not in sys.modules:  # read only when the application imported it
        return None
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    config = HydraConfig.get()
    output_dir = config.runtime.output_dir
    if not output_dir:
        return None
    subdir = config.output_subdir
    return HydraLaunch(
        Path(output_dir).resolve(),
        bool(config.job.chdir),
        str(config.launcher.get("_target_") or ""),
        None if subdir is None else Path(output_dir).resolve() / str(subdir) / "config.yaml",
    )


def root_lost_on_restart(root: Path, launch: HydraLaunch) -> bool:
    """Whether runs under ``root`` cannot be found by the next launch: ``root`` is in its output dir."""
    keeps_output_dir = "submitit" in launch.launcher.lower()  # a restart runs in the same output dir
    return not keeps_output_dir and root.resolve().is_relative_to(launch.output_dir)
