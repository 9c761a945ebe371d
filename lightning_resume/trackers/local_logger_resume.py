"""``LocalLoggerResume``: a restarted job continues the TensorBoard/CSV logs of its first attempt."""

from __future__ import annotations

import contextlib
import logging
import os
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
    log_dir_exists,
    logging_step,
    point_logger_at_version,
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
#: Identity fields that say where a logger's version dirs live.
PLACE_FIELDS = ("dir", "name")


def kind_of(logger: Logger) -> str | None:
    """``"tensorboard"``, ``"csv"`` or ``None`` (a logger this callback does not handle)."""
    if isinstance(logger, TensorBoardLogger):
        return TENSORBOARD
    if isinstance(logger, CSVLogger):
        return CSV
    return None


def identity_of(logger: Logger) -> dict[str, Any]:
    """Where ``logger`` writes: ``id`` (its version dir), ``dir`` (``save_dir``), ``name``, ``version``."""
    return {
        "id": str(Path(str(logger.log_dir)).expanduser().resolve()),
        "dir": str(Path(str(logger.save_dir)).expanduser().resolve()),
        "name": logger.name,
        "version": logger.version,
    }


def _is_remote(logger: Logger) -> bool:
    return "://" in str(logger.save_dir)


class LocalLoggerResume(Callback):
    """Keep a restarted job in the version dir of its ``TensorBoardLogger``/``CSVLogger``: one series per run.

    Works for your loggers and the Trainer's default one. The first attempt records each logger's
    version dir in ``<run dir>/tensorboard_resume.json`` / ``csv_resume.json`` and links it as
    ``<run dir>/logs/tensorboard`` / ``logs/csv``. A restart (see :class:`~lightning_resume.RunDir`):

    - logs into the recorded version dir again (a logger that took the next ``version_N`` is pointed
      back and the dir it made removed; hyperparameters logged before ``fit`` follow it).
    - drops what the interrupted attempt logged at the steps the restart logs again: TensorBoard gets
      the ``SessionLog(START)`` event of ``SummaryWriter(purge_step=...)`` at the resumed step, and
      ``metrics.csv`` keeps only the rows before it.

    A logger whose ``save_dir`` or ``name`` changed is not moved back (one warning). The first logger
    of each kind is handled; remote logs (``s3://...``) are left as they are. TensorBoard's
    ``hp_metric`` placeholder is logged at step 0 by every attempt (``default_hp_metric=False``).

    Raises:
        MissingCallbackError: at ``setup`` when no :class:`~lightning_resume.RunDir` was constructed.

    Example::

        trainer = Trainer(callbacks=[RunDir(root="runs"), RequeueCheckpoint(), LocalLoggerResume()])
        trainer.fit(model)  # the default TensorBoard logger continues lightning_logs/version_0
    """

    def __init__(self) -> None:
        self._run_dir: Path | None = None
        self._restart = False
        self._recorded: dict[str, dict[str, Any]] = {}
        self._kept: set[str] = set()  # kinds whose metrics.csv was set aside by this process
        self._continued: dict[str, Any] = {}  # kind -> logger to trim at the first resumed batch
        self._quiet: list[QuietLightning] = []
        PROCESS.when_ready(self._on_run_dir)

    # -- binding: before fit, before the loggers create their writers --------------------------------

    def _on_run_dir(self, resolution: Resolution) -> None:
        self._run_dir = resolution.path
        self._restart = resolution.is_resumed
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
            if kind == CSV and is_global_zero(os.environ) and _local_logs.set_aside_metrics(log_dir):
                self._kept.add(kind)
                self._quiet.append(QuietLightning(self, log_dir_exists(log_dir)))

    # -- hooks ----------------------------------------------------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if self._run_dir is None:
            raise missing("RunDir", "LocalLoggerResume", "the record of the log dir lives in the run dir")
        handled: set[str] = set()
        for logger in trainer.loggers:
            kind = kind_of(logger)
            if kind is None or kind in handled:
                continue
            handled.add(kind)
            if _is_remote(logger):
                log.info("LocalLoggerResume leaves %s logs on %s as they are", kind, logger.save_dir)
                continue
            recorded = self._recorded.get(kind)
            if recorded is not None and self._continue(trainer, logger, kind, recorded):
                self._continued[kind] = logger
            elif kind == TENSORBOARD and trainer.is_global_zero:
                _mark_first_start(logger)
            if trainer.is_global_zero:
                self._record(trainer, logger, kind)
        if trainer.is_global_zero:
            for kind in self._kept - set(self._continued):
                _local_logs.put_back_metrics(Path(self._recorded[kind]["id"]))
            self._kept &= set(self._continued)

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
            carried = _csv_hparams(logger) if trainer.is_global_zero and kind == CSV else {}
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
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # The first batch of a resumed attempt: the logging step is final only from here.
        if self._continued:
            self._trim(trainer, logging_step(trainer))

    def _trim(self, trainer: pl.Trainer, step: int | None) -> None:
        """Drop what the interrupted attempt logged at steps ``>= step`` (``None``: keep everything)."""
        continued, self._continued = self._continued, {}
        if not trainer.is_global_zero:
            return
        for kind, logger in continued.items():
            log_dir = Path(logger.log_dir)
            if kind == TENSORBOARD and step is not None:
                _local_logs.write_purge_event(logger.experiment, step)
            elif kind == CSV and kind in self._kept:
                self._kept.discard(kind)
                header = _local_logs.merge_kept_rows(log_dir, step if step is not None else float("inf"))
                logger.experiment.metrics_keys = header  # later rows use the merged file's columns
            if step is None:
                log.info(
                    "Restart: %s logs of the interrupted attempt kept whole (this attempt ran no batch)", kind
                )
            else:
                log.info("Restart: %s logs of the interrupted attempt at steps >= %s dropped", kind, step)

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
        # An attempt that ran no batch logged nothing to replace: the kept rows all go back.
        self._trim(trainer, None)
        for quiet in self._quiet:
            quiet.remove()
        self._quiet = []


def _csv_hparams(logger: Any) -> dict[str, Any]:
    """The hyperparameters a ``CSVLogger``'s writer has logged so far (``{}`` for another writer)."""
    hparams = getattr(logger.experiment, "hparams", None)
    return dict(hparams) if isinstance(hparams, dict) else {}


def _mark_first_start(logger: Any) -> None:
    """A fresh version dir's first START (TensorBoard's server ignores the first one it sees)."""
    writer = logger.experiment
    if not _local_logs.has_other_events(Path(logger.log_dir)):
        _local_logs.write_purge_event(writer, 0)


def _link(link: Path, target: Path) -> None:
    """``link`` -> ``target``, replaced atomically (relative inside the run dir, so it can be moved);
    a filesystem without symlinks goes without."""
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
