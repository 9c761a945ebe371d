"""What ``lightning-resume check`` asks of an attempt it launched: a step limit, a fixed cadence, every rank's
timeline, the final state, and a kill of the attempt's process group at a chosen point."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path
from typing import IO, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_resume._checks import the_one
from lightning_resume._scheduler.environment import CheckSettings, check_settings, final_path, timeline_path
from lightning_resume._storage.atomic import atomic_open
from lightning_resume._storage.commit import process_alive
from lightning_resume.exact_resume.self_check import batch_digest

#: Without ``steps``: at most two epochs, at most this many steps.
DEFAULT_STEPS, DEFAULT_EPOCHS = 200, 2
#: The points an attempt can be killed at: ``kind:step`` (``first-step``: the attempt's first step).
KILLS = ("step", "sigterm", "save", "in-save", "validation", "first-step")


class CheckHooks(Callback):
    """The check's part inside ``fit`` (one per Trainer, after every other callback)."""

    def __init__(self, settings: CheckSettings, run_dir: Path, cadence: Any) -> None:
        kind, _, step = (settings.kill or "").partition(":")
        if kind and kind not in KILLS:
            raise ValueError(f"lightning-resume check: unknown kill point {settings.kill!r} (one of {KILLS})")
        self._kill = (kind, int(step) if step else None) if kind else None
        self._settings, self._run_dir, self._cadence = settings, run_dir, cadence
        self._file: IO[str] | None = None
        self._limit = DEFAULT_STEPS
        self._seen = -1  # the global step after the last batch
        self._first = True  # no step taken by this attempt yet
        self._since_epoch_end: int | None = None  # batches since the last epoch end

    @classmethod
    def insert(cls, trainer: pl.Trainer, run_dir: Path, cadence: Any) -> CheckHooks | None:
        """Under the check, the Trainer's :class:`CheckHooks` (added last); else ``None``."""
        settings = check_settings(os.environ)
        if settings is None:
            return None
        found = the_one(trainer, cls)
        if found is None:
            found = cls(settings, run_dir, cadence)
            trainer.callbacks.append(found)  # type: ignore[attr-defined]
        if found._file is None:  # inserted during the setup hooks: its own setup may not be called
            folder = Path(settings.folder)
            folder.mkdir(parents=True, exist_ok=True)
            found._file = open(timeline_path(folder, trainer.global_rank), "a")  # noqa: SIM115
        return found

    def _record(self, event: str, trainer: pl.Trainer, **fields: Any) -> None:
        if self._file is not None:
            line = {"e": event, "s": trainer.global_step, "ep": trainer.current_epoch, **fields}
            self._file.write(json.dumps(line) + "\n")
            self._file.flush()  # a SIGKILL keeps what was written

    def _strike(self, trainer: pl.Trainer, kind: str, step: int | None = None) -> None:
        """Kill this attempt here if that is the chosen point (global rank 0 kills every process)."""
        if self._kill != (kind, step) or not trainer.is_global_zero:
            return
        self._kill = None
        sig = signal.SIGTERM if kind == "sigterm" else signal.SIGKILL
        self._record("kill", trainer, at=kind, sig=sig.name)
        group = os.getpgrp()
        try:  # never the check's own group (a command run without a session of its own)
            ours = self._settings.driver is not None and os.getpgid(self._settings.driver) == group
        except ProcessLookupError:
            ours = False
        if ours:
            os.kill(os.getpid(), sig)
        else:
            os.killpg(group, sig)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        per_epoch = trainer.num_training_batches / max(trainer.accumulate_grad_batches, 1)
        epochs = DEFAULT_STEPS if math.isinf(per_epoch) else DEFAULT_EPOCHS * math.ceil(per_epoch)
        self._limit = self._settings.steps or min(DEFAULT_STEPS, epochs)
        self._cadence.fixed = self._settings.every or max(1, self._limit // 8)
        self._seen = trainer.global_step
        loggers = [[type(lg).__name__, os.path.abspath(lg.log_dir)] for lg in trainer.loggers if lg.log_dir]
        self._record(
            "start", trainer, pid=os.getpid(), run_dir=str(self._run_dir), loggers=loggers,
            limit=self._limit, every=self._cadence.fixed,
        )  # fmt: skip

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._since_epoch_end is not None:
            self._since_epoch_end += 1
        self._record("batch", trainer, i=batch_idx, d=batch_digest(batch))

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._seen:
            return  # inside an accumulation window
        self._seen = trainer.global_step
        weights = list(pl_module.parameters())
        self._record("step", trainer, loss=batch_digest(outputs), w=batch_digest(weights))
        if trainer.global_step >= self._limit:
            trainer.should_stop = True
        if self._settings.driver is not None and not process_alive(self._settings.driver):
            os.killpg(os.getpgrp(), signal.SIGKILL)  # the check was killed: nobody waits for this run
        if self._first:
            self._first = False
            self._strike(trainer, "first-step")
        self._strike(trainer, "step", trainer.global_step)
        self._strike(trainer, "sigterm", trainer.global_step)

    @override
    def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._strike(trainer, "validation", trainer.global_step)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._record("val", trainer)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._since_epoch_end = 0
        self._record("epoch_end", trainer)

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._strike(trainer, "in-save", trainer.global_step)  # assembled, nothing of it written yet

    def saved(self, trainer: pl.Trainer) -> None:
        """``RequeueCheckpoint`` wrote ``last.ckpt`` (every rank)."""
        at_epoch_end = self._since_epoch_end is not None and self._since_epoch_end <= 1
        self._record("save", trainer, epoch_end=at_epoch_end)
        self._strike(trainer, "save", trainer.global_step)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        weights = pl_module.state_dict()
        final = {
            "global_step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "state_dict": {k: v.to_local() if hasattr(v, "to_local") else v for k, v in weights.items()},
            "optimizers": [o.state_dict() for o in trainer.optimizers],
            "schedulers": [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs],
        }
        with atomic_open(final_path(Path(self._settings.folder), trainer.global_rank)) as f:
            torch.save(final, f)
        self._record("end", trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self._file is not None:
            self._file.close()
            self._file = None
