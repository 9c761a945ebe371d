"""``LocalLoggerResume``: a restarted job continues the TensorBoard/CSV logs of its first attempt, cut
exactly at the checkpoint it resumes from."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import uuid
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from typing_extensions import override

from lightning_resume._checks import missing
from lightning_resume._compat.lightning import (
    QuietLightning,
    any_log_dir_exists,
    continue_csv_rows,
    log_dir_exists,
    point_logger_at_version,
    put_callback,
)
from lightning_resume._scheduler.environment import is_global_zero
from lightning_resume._warnings import warn
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.binding import PROCESS
from lightning_resume.run_dir.resolve import Resolution
from lightning_resume.trackers import _local_logs
from lightning_resume.trackers.sidecar import Sidecar, describe, place_conflicts, read_sidecar, sidecar_path
from lightning_resume.trackers.sidecar import write_sidecar as _write_sidecar

log = logging.getLogger(__name__)

TENSORBOARD, CSV = "tensorboard", "csv"
#: The state key of the exact resume, whose state says whether a save was made inside a validation.
_EXACT_RESUME = "ExactResume"
#: Identity fields that say where a logger's version dirs live.
PLACE_FIELDS = ("dir", "name")


def kind_of(logger: Logger) -> str | None:
    """``"tensorboard"``, ``"csv"`` or ``None`` (a logger this callback does not handle)."""
    if isinstance(logger, TensorBoardLogger):
        return TENSORBOARD
    return CSV if isinstance(logger, CSVLogger) else None


def identity_of(logger: Logger) -> dict[str, Any]:
    """Where ``logger`` writes: ``id`` (its version dir), ``dir`` (``save_dir``), ``name``, ``version``."""
    return {
        "id": str(Path(str(logger.log_dir)).expanduser().resolve()),
        "dir": str(Path(str(logger.save_dir)).expanduser().resolve()),
        "name": logger.name,
        "version": logger.version,
    }


class LocalLoggerResume(Callback):
    """Keep a restarted job in the version dir of its ``TensorBoardLogger``/``CSVLogger``, its logs cut
    exactly at the checkpoint it resumes from: every event is there once, as in an uninterrupted run.

    Works for your loggers and the Trainer's default one. The first attempt records each logger's
    version dir in ``<run dir>/tensorboard_resume.json`` / ``csv_resume.json`` and links it as
    ``<run dir>/logs/tensorboard`` / ``logs/csv``. Each save records where the logs stood at its resume
    point (the event files' lengths, the rows of ``metrics.csv``). A restart (see
    :class:`~lightning_resume.RunDir`):

    - logs into the recorded version dir again (a logger that took the next ``version_N`` is pointed
      back and the dir it made removed; hyperparameters logged before ``fit`` follow it).
    - cuts the logs back to the loaded checkpoint's position as it reaches that resume point: what the
      interrupted attempt logged after it goes, and so does what this attempt logged while starting
      (hyperparameters, ``hp_metric``, a sanity check), which the logs already hold once.

    A logger whose ``save_dir`` or ``name`` changed is not moved back (one warning). The first logger
    of each kind is handled; remote logs (``s3://...``) are left as they are.
    :class:`~lightning_resume.RequeueCheckpoint` puts one in by itself when the Trainer lists none.

    Raises:
        MissingCallbackError: at ``setup`` when no :class:`~lightning_resume.RunDir` was constructed.

    Example::

        trainer = Trainer(callbacks=[RunDir(root="runs"), RequeueCheckpoint()])  # one put in
        trainer.fit(model)  # the default TensorBoard logger continues lightning_logs/version_0
    """

    def __init__(self) -> None:
        self._run_dir: Path | None = None
        self._recorded: dict[str, dict[str, Any]] = {}
        self._before: dict[str, int] = {}  # event files of the recorded TensorBoard dir before this process
        self._kept: set[str] = set()  # kinds whose metrics.csv was set aside by this process
        self._loggers: dict[str, Any] = {}  # kind -> the logger handled (rank 0)
        self._continued: dict[str, Any] = {}  # kind -> logger continuing the interrupted attempt's logs
        self._loaded: dict[str, Any] | None = None  # the loaded checkpoint's position record
        self._cut_due = False  # the logs are cut at this attempt's first resume point
        self._pending: list[str] = []  # saves whose resume point comes next
        self._at_validation: dict[str, Any] | None = None  # the position as this validation started
        self._quiet: list[QuietLightning] = []
        PROCESS.when_ready(self._on_run_dir)

    def _on_run_dir(self, resolution: Resolution) -> None:
        self._run_dir = resolution.path
        if not resolution.is_resumed:
            return
        for kind in (TENSORBOARD, CSV):
            try:
                recorded = read_sidecar(sidecar_path(resolution.path, kind), kind)
            except ValueError as e:
                warn(
                    f"LocalLoggerResume: the {kind} sidecar of this restarted run is unusable: {e}. Training "
                    f"still resumes from its checkpoint, but the {kind} logs start a new version."
                )
                continue
            if recorded is None:
                continue
            self._recorded[kind] = recorded.identity
            log_dir = Path(recorded.identity["id"])
            if not is_global_zero(os.environ):
                continue
            if kind == TENSORBOARD:
                self._before = _local_logs.event_files(log_dir) if log_dir.is_dir() else {}
            elif _local_logs.set_aside_metrics(log_dir):
                self._kept.add(kind)
                self._quiet.append(QuietLightning(self, log_dir_exists(log_dir)))

    def join(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Join ``trainer``'s callbacks for ``fit`` and set up, unless it has a ``LocalLoggerResume`` of its
        own (then stand down: this one changes nothing)."""
        callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
        if self in callbacks:
            return  # joined for an earlier fit: Lightning sets it up
        if any(isinstance(cb, LocalLoggerResume) for cb in callbacks):
            for quiet in self._quiet:
                quiet.remove()
            self._quiet, self._kept = [], set()  # the user's own continues what was set aside
            return
        self.setup(trainer, pl_module, "fit")

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if self._run_dir is None:
            raise missing("RunDir", "LocalLoggerResume", "the record of the log dir lives in the run dir")
        # First among the callbacks: a restart's cut and a save's resume point come before anything another
        # callback logs at the same hook (LearningRateMonitor's rate at an epoch's start).
        put_callback(trainer, self)
        self._loggers, self._continued, self._pending = {}, {}, []
        for logger in trainer.loggers:
            kind = kind_of(logger)
            if kind is None or kind in self._loggers:
                continue
            if "://" in str(logger.save_dir):
                log.info("LocalLoggerResume leaves %s logs on %s as they are", kind, logger.save_dir)
                continue
            recorded = self._recorded.get(kind)
            if recorded is not None and self._continue(trainer, logger, kind, recorded):
                self._continued[kind] = logger
            if trainer.is_global_zero:
                self._loggers[kind] = logger
                self._record(trainer, logger, kind)
        if trainer.is_global_zero:
            for kind in self._kept - set(self._continued):
                _local_logs.put_back_metrics(Path(self._recorded[kind]["id"]))
            self._kept &= set(self._continued)
            self._cut_due = bool(self._continued)

    def _continue(self, trainer: pl.Trainer, logger: Any, kind: str, recorded: dict[str, Any]) -> bool:
        """Point ``logger`` at its recorded version dir; ``False`` when it is now configured elsewhere."""
        now = identity_of(logger)
        conflicts = place_conflicts(recorded, now, PLACE_FIELDS, known_only=False)
        if conflicts:
            warn(
                f"LocalLoggerResume: not continuing the {kind} logs in {recorded['id']!r}: the logger is now "
                f"configured for another place ({describe(conflicts)}). It logs to {now['id']!r} instead."
            )
            return False
        if str(now["version"]) != str(recorded["version"]):
            new_dir = Path(now["id"])
            # Hyperparameters logged before fit (lightning-hydra-template does) went to the new dir.
            carried: dict[str, Any] = {}
            if trainer.is_global_zero and kind == CSV:
                hparams = getattr(logger.experiment, "hparams", None)  # (another writer may have none)
                carried = dict(hparams) if isinstance(hparams, dict) else {}
            if trainer.is_global_zero and kind == TENSORBOARD:
                logger.experiment.close()
            point_logger_at_version(logger, recorded["version"])
            if trainer.is_global_zero:
                _local_logs.remove_new_log_dir(new_dir, (_local_logs.HPARAMS,) if carried else ())
                with any_log_dir_exists():
                    _ = logger.experiment  # the writer in the recorded dir, as Lightning makes it
                if carried:
                    logger.experiment.log_hparams(carried)
            log.info("Restart: %s logs continue in %s (not %s)", kind, recorded["id"], new_dir)
        return True

    def _record(self, trainer: pl.Trainer, logger: Logger, kind: str) -> None:
        assert self._run_dir is not None
        identity = identity_of(logger)
        _write_sidecar(sidecar_path(self._run_dir, kind), kind, Sidecar(identity, {}, trainer.global_step))
        _link(layout.logs_link(self._run_dir, kind), Path(identity["id"]))

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = dict(state_dict)

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if not (trainer.is_global_zero and self._loggers and isinstance(checkpoint.get("callbacks"), dict)):
            return
        self._cut_if_due(trainer)
        token = uuid.uuid4().hex
        redone = checkpoint["callbacks"].get(_EXACT_RESUME) or {}
        if redone.get("in_validation") and self._at_validation is not None:
            # Saved inside a validation: the restart runs that validation again from its start.
            state = {"token": token, "position": self._at_validation, "final": True}
        else:
            # Its resume point is this callback's next hook (Lightning logs the saved step's metrics
            # after the save); until that is recorded, everything logged by then belongs before it.
            state = {"token": token, "position": self._position(), "final": False}
            self._pending.append(token)
        checkpoint["callbacks"][self.state_key] = state

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._at_resume_point(trainer)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._at_resume_point(trainer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit" and trainer.validating and not trainer.sanity_checking:
            self._at_resume_point(trainer)
            if trainer.is_global_zero and self._loggers:
                self._at_validation = self._position()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._at_resume_point(trainer)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._finish(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._finish(trainer)

    def _finish(self, trainer: pl.Trainer) -> None:
        self._at_resume_point(trainer)  # an attempt that ran no batch: its end is where it stopped
        for quiet in self._quiet:
            quiet.remove()
        self._quiet = []

    def _at_resume_point(self, trainer: pl.Trainer) -> None:
        """A hook a restart may resume at: cut a restart's logs (once), record the pending saves' position."""
        if not trainer.is_global_zero:
            return
        self._cut_if_due(trainer)
        if self._pending:
            _local_logs.record_cuts(self._cuts(), self._pending, self._position())
            self._pending = []

    def _cuts(self) -> Path:
        assert self._run_dir is not None
        return self._run_dir / layout.LOGS / _local_logs.CUTS

    def _position(self) -> dict[str, Any]:
        """Where each handled logger's files stand now (its writer flushed first)."""
        position: dict[str, Any] = {}
        for kind, logger in self._loggers.items():
            logger.save()
            log_dir = Path(identity_of(logger)["id"])
            if kind == TENSORBOARD:
                position[kind] = {"dir": str(log_dir), "files": _local_logs.event_files(log_dir)}
            else:
                rows = _local_logs.count_rows(log_dir / _local_logs.METRICS)
                position[kind] = {"dir": str(log_dir), "rows": rows}
        return position

    def _resume_position(self) -> tuple[dict[str, Any] | None, bool]:
        """The loaded checkpoint's position, and whether to keep it whole (no resume point recorded)."""
        state = self._loaded
        if not state or not isinstance(state.get("position"), dict):
            return None, False
        if state.get("final"):
            return state["position"], False
        found = _local_logs.read_cuts(self._cuts()).get(str(state.get("token")))
        return (found, False) if isinstance(found, dict) else (state["position"], True)

    def _cut_if_due(self, trainer: pl.Trainer) -> None:
        """At the first resume point: cut what was logged after the checkpoint's, and this attempt's start."""
        if not self._cut_due:
            return
        self._cut_due = False
        position, whole = self._resume_position()
        for kind, logger in self._continued.items():
            log_dir = Path(identity_of(logger)["id"])
            mark = (position or {}).get(kind)
            mark = mark if isinstance(mark, dict) else None
            # Nothing loaded, or another run's checkpoint (its logs elsewhere): the run starts over.
            fresh = trainer.ckpt_path is None or (mark is not None and mark.get("dir") != str(log_dir))
            mark = None if fresh else mark
            if mark is None and not fresh:
                how = "kept whole (the checkpoint loaded has no record of them)"
            elif mark is None:
                how = "of the interrupted attempt dropped (this run starts over)"
            elif whole:
                how = "kept whole (the interrupted attempt stopped before its next resume point)"
            else:
                how = "cut back to the checkpoint loaded"
            if kind == TENSORBOARD:
                self._cut_events(logger, log_dir, mark, whole, fresh)
            else:
                self._cut_metrics(logger, log_dir, mark, whole, fresh)
            log.info("Restart: %s logs %s", kind, how)

    def _cut_events(self, logger: Any, log_dir: Path, mark: Any, whole: bool, fresh: bool) -> None:
        if mark is not None:
            files: dict[str, int] = mark.get("files") or {}
            keep: dict[str, float] = {n: math.inf for n in files} if whole else dict(files)
        elif fresh:  # only the event files made since this process started, whole
            keep = {name: math.inf for name in _local_logs.event_files(log_dir) if name not in self._before}
        else:
            return
        logger.experiment.close()  # this attempt's writer: a new one (a new file) at the next event
        _local_logs.cut_events(log_dir, keep)
        point_logger_at_version(logger, logger.version)

    def _cut_metrics(self, logger: Any, log_dir: Path, mark: Any, whole: bool, fresh: bool) -> None:
        if mark is not None:
            rows, own = (math.inf if whole else float(mark.get("rows", 0))), False
        else:
            rows, own = (0.0 if fresh else math.inf), True
        logger.save()  # rows the writer still holds are this attempt's start: in the file, and cut too
        continue_csv_rows(logger, _local_logs.cut_metrics(log_dir, rows, own))
        self._kept.discard(CSV)


def _link(link: Path, target: Path) -> None:
    """``link`` -> ``target``, replaced atomically, relative inside the run dir; skipped without symlinks."""
    run_dir = link.parent.parent
    value = Path(os.path.relpath(target, link.parent)) if target.is_relative_to(run_dir) else target
    try:
        link.parent.mkdir(exist_ok=True)
        if link.is_symlink() and Path(os.readlink(link)) == value:
            return
        temporary = link.with_name(f".{link.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        temporary.symlink_to(value, target_is_directory=True)
        os.replace(temporary, link)
    except OSError as e:
        log.debug("no link %s -> %s: %s", link, target, e)
