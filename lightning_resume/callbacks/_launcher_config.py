"""What the launcher configured, kept with the run: called by ``RunDir.setup``.

- **LightningCLI**: its ``SaveConfigCallback`` saves the configuration into the run dir, not the log
  dir. A restart compares the configuration with the saved one: identical, one INFO line; changed,
  the earlier file is kept as ``config.1.yaml`` and one warning names the changed keys. Lightning's
  own behaviour (``RuntimeError`` when the file exists) would stop every restart.
- **Hydra**: a warning when the runs root is inside the launch's output dir, which the next launch
  does not use.

``RunDir.setup`` runs before ``SaveConfigCallback.setup``: LightningCLI appends that callback after
the configured ones.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import yaml

from lightning_resume._run import hydra, saved_config
from lightning_resume._warnings import warn
from lightning_resume._writer.atomic import replace_durably

if TYPE_CHECKING:
    from lightning_resume.callbacks.run_dir import RunDir

log = logging.getLogger(__name__)


def on_setup(run_dir: RunDir, trainer: pl.Trainer) -> None:
    """Put LightningCLI's configuration into the run dir and check Hydra's output dir (every rank)."""
    for callback in _save_config_callbacks(trainer):
        _save_into_run_dir(run_dir, trainer, callback)
    launch = hydra.current_launch()
    if launch is not None and trainer.is_global_zero and hydra.root_lost_on_restart(run_dir.root, launch):
        warn(
            f"RunDir: the runs root {str(run_dir.root)!r} is inside Hydra's output dir of this launch "
            f"({str(launch.output_dir)!r}{', the working dir' if launch.chdir else ''}). Hydra gives the "
            "next launch a new output dir, so a restart will not find this run and starts a new one. Use "
            "an absolute root, or root: ${hydra:runtime.cwd}/runs."
        )


def _save_config_callbacks(trainer: pl.Trainer) -> list[Any]:
    """LightningCLI's ``SaveConfigCallback``s of ``trainer`` (none unless the application imports the CLI)."""
    cli = sys.modules.get("lightning.pytorch.cli")
    kind = getattr(cli, "SaveConfigCallback", None)
    if kind is None:
        return []
    return [cb for cb in trainer.callbacks if isinstance(cb, kind)]  # type: ignore[attr-defined]


def _save_into_run_dir(run_dir: RunDir, trainer: pl.Trainer, callback: Any) -> None:
    if callback.already_saved or not callback.save_to_log_dir:
        return
    if os.path.isabs(callback.config_filename):
        return  # the user chose the place
    target = run_dir.path / callback.config_filename
    # SaveConfigCallback saves to os.path.join(trainer.log_dir, config_filename): an absolute name wins.
    callback.config_filename = str(target)
    # On every rank: with overwrite=False the callback broadcasts, and ranks must agree on collectives.
    callback.overwrite = True
    if trainer.is_global_zero:
        _compare_with_saved(run_dir, target, callback)


def _compare_with_saved(run_dir: RunDir, target: Path, callback: Any) -> None:
    try:
        before = saved_config.read_config(target)
    except ValueError as e:
        kept = _keep(target)
        warn(
            f"RunDir: the saved LightningCLI configuration of run {run_dir.run_id!r} is unusable ({e}); "
            f"it is kept as {str(kept)!r} and this attempt's configuration is saved as {str(target)!r}."
        )
        return
    if before is None:
        return
    now = yaml.safe_load(callback.parser.dump(callback.config, skip_none=False))
    found = saved_config.changes(before, now if isinstance(now, dict) else {})
    if not found:
        log.info(
            "Restart of run %s: the LightningCLI configuration is unchanged (%s)", run_dir.run_id, target
        )
        return
    kept = _keep(target)
    warn(
        f"RunDir: the LightningCLI configuration of run {run_dir.run_id!r} changed since its previous "
        f"attempt: {saved_config.describe(found)}. The run continues with the new configuration, saved as "
        f"{str(target)!r}; the previous one is kept as {str(kept)!r}."
    )


def _keep(target: Path) -> Path:
    kept = saved_config.kept_name(target)
    replace_durably(target, kept)
    return kept
