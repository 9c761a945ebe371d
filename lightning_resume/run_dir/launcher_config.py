"""LightningCLI's and Hydra's configuration, kept with the run: a restart's changed one keeps the earlier
file as ``config.1.yaml`` and warns with the changed keys."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import yaml

from lightning_resume._storage.atomic import replace_durably, write_text_atomic
from lightning_resume._warnings import warn
from lightning_resume.run_dir import hydra, saved_config

log = logging.getLogger(__name__)

HYDRA_CONFIG = "hydra_config.yaml"  # Hydra's composed configuration, as kept in the run dir


def on_setup(trainer: pl.Trainer, root: Path, run_dir: Path, run_id: str, first: bool = True) -> None:
    """Keep LightningCLI's and Hydra's configuration in ``run_dir``; check Hydra's (``first`` setup only)."""
    # Before LightningCLI's SaveConfigCallback (appended last); none unless the application imports the CLI.
    cli = sys.modules.get("lightning.pytorch.cli")
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, getattr(cli, "SaveConfigCallback", ())):
            _save_into_run_dir(run_dir, run_id, trainer, callback)
    launch = hydra.current_launch()
    if launch is None or not trainer.is_global_zero or not first:
        return
    if hydra.root_lost_on_restart(root, launch):
        warn(
            f"RunDir: the runs root {str(root)!r} is inside Hydra's output dir of this launch "
            f"({str(launch.output_dir)!r}{', the working dir' if launch.chdir else ''}). Hydra gives the "
            "next launch a new output dir, so a restart will not find this run and starts a new one. Use "
            "an absolute root, or root: ${hydra:runtime.cwd}/runs."
        )
    if launch.config_file is not None and launch.config_file.is_file():
        target = run_dir / HYDRA_CONFIG
        if _compare_with_saved(run_id, target, "Hydra", launch.config_file.read_text()):
            write_text_atomic(target, launch.config_file.read_text())


def _save_into_run_dir(run_dir: Path, run_id: str, trainer: pl.Trainer, callback: Any) -> None:
    if callback.already_saved or not callback.save_to_log_dir or os.path.isabs(callback.config_filename):
        return  # nothing to save, or the user chose the place
    target = run_dir / callback.config_filename
    # SaveConfigCallback saves to os.path.join(trainer.log_dir, config_filename): an absolute name wins.
    # It overwrites: Lightning's RuntimeError on an existing file would stop every restart.
    callback.config_filename = str(target)
    # On every rank: with overwrite=False the callback broadcasts, and ranks must agree on collectives.
    callback.overwrite = True
    if trainer.is_global_zero:
        _compare_with_saved(
            run_id, target, "LightningCLI", callback.parser.dump(callback.config, skip_none=False)
        )


def _compare_with_saved(run_id: str, target: Path, launcher: str, now_text: str) -> bool:
    """Whether to save ``now_text`` at ``target`` (a changed or unusable saved file is kept aside)."""
    try:
        before = saved_config.read_config(target)
    except ValueError as e:
        kept = saved_config.kept_name(target)
        message = (
            f"RunDir: the saved {launcher} configuration of run {run_id!r} is unusable ({e}); it is "
            f"kept as {str(kept)!r} and this attempt's configuration is saved as {str(target)!r}."
        )
    else:
        if before is None:
            return True
        now = yaml.safe_load(now_text)
        found = saved_config.changes(before, now if isinstance(now, dict) else {})
        if not found:
            log.info("Restart of run %s: the %s configuration is unchanged (%s)", run_id, launcher, target)
            return False
        kept = saved_config.kept_name(target)
        message = (
            f"RunDir: the {launcher} configuration of run {run_id!r} changed since its previous "
            f"attempt: {saved_config.describe(found)}. The run continues with the new configuration, saved "
            f"as {str(target)!r}; the previous one is kept as {str(kept)!r}."
        )
    # Warn first: a filter that turns the warning into an error leaves the saved file where it is.
    warn(message)
    replace_durably(target, kept)
    return True
