"""``RunDir``: one directory per run, found again by a restarted job."""

from __future__ import annotations

import logging
import os
import time
import weakref
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from typing_extensions import override

from lightning_resume._checks import positive_number
from lightning_resume._collectives import any_rank, broadcast
from lightning_resume._compat.lightning import QuietLightning, checkpoint_dir_not_empty
from lightning_resume._log import show_info_lines
from lightning_resume._scheduler.environment import (
    ENV,
    KeySource,
    check_settings,
    expects_peers,
    global_rank,
    is_global_zero,
    launch_key,
    read_session,
)
from lightning_resume._warnings import warn
from lightning_resume.exceptions import ResumeError, RunDirError
from lightning_resume.run_dir import handoff, layout, resolve
from lightning_resume.run_dir import launcher_config as _launcher_config
from lightning_resume.run_dir.attempt_recorder import AttemptRecorder
from lightning_resume.run_dir.binding import PROCESS
from lightning_resume.run_dir.own_checkpoint_load import OwnCheckpointLoad
from lightning_resume.run_dir.owner import RunLock
from lightning_resume.run_dir.status import RunStatus, write_status

log = logging.getLogger(__name__)

# The RunDirs alive in this process (weakly held), to recognise a second one for the same session.
_LIVE: weakref.WeakSet[RunDir] = weakref.WeakSet()


def attempts_of(run_dir: RunDir) -> AttemptRecorder:
    """This attempt's record in ``attempts.json``: the one way into it from outside ``run_dir/``."""
    return run_dir._attempts


class RunDir(Callback):
    """Give the run a directory that a preempted, restarted job finds again.

    The directory is decided at construction, before ``Trainer.fit`` picks a checkpoint or a logger
    creates its run. A fresh run gets ``root/YYYYMMDD/HHMMSS/<run_id>/`` with a ``run_meta.json``, and
    its session key (SLURM ``JOB_ID[_ARRAY_TASK_ID]``, TorchElastic's run id, or ``key``) is recorded in
    ``root/.index/<key>``. A restart (``SLURM_RESTART_COUNT >= 1``, a TorchElastic restart, or an
    explicit key already indexed) reuses the recorded directory. All ranks use rank 0's choice.

    During ``fit`` it points every ``ModelCheckpoint`` without a ``dirpath`` at :attr:`checkpoint_dir`,
    checks that the index still points at this run, and refuses on a restart a checkpoint of another
    run. It keeps LightningCLI's and Hydra's configuration (warning with the keys a restart changed,
    or of a root Hydra's next launch would not find), and records every attempt in ``attempts.json``
    (read by ``lightning-resume inspect`` and :class:`~lightning_resume.ProgressWatchdog`).

    Args:
        root: Folder that holds all runs and the session index.
        key: Explicit session key (Kubernetes Job, a rerun by hand). Defaults to
            ``$LIGHTNING_RESUME_KEY``, then the scheduler's ids.
        handoff_timeout: Seconds ranks other than 0 wait for rank 0's choice.

    Raises:
        RunDirError: when the directory cannot be decided without risking the run (see messages).
        ValueError: an empty ``root`` or ``key``, or ``handoff_timeout`` not above 0.

    Example::

        run_dir = RunDir(root="runs")
        trainer = Trainer(callbacks=[run_dir, RequeueCheckpoint(every_n_train_steps=100)])
        trainer.fit(model, datamodule=dm)
    """

    def __init__(
        self, root: str | Path = "runs", key: str | None = None, handoff_timeout: float = 120.0
    ) -> None:
        constructed = time.time()  # our code's first moment in this process: the imports are behind it
        positive_number("handoff_timeout", handoff_timeout, "number of seconds")
        show_info_lines()  # "RunDir ... (restart ...)" where Lightning's own lines appear
        if not isinstance(root, (str, Path)) or not str(root).strip():
            raise ValueError(f"root must be a directory path, got {root!r}.")
        if key is not None:
            resolve.check_key(key, "RunDir(key=...)")
        check = check_settings(os.environ)  # under `lightning-resume check`: the check's own root
        self.root = (Path(check.folder) / "runs" if check else Path(root)).expanduser().resolve()
        self.key = key
        self.handoff_timeout = float(handoff_timeout)
        self._session = read_session(os.environ, key)
        if self._session.source is KeySource.EXPLICIT and key is None:
            try:
                resolve.check_key(str(self._session.key), f"${ENV['key']}")
            except ValueError as e:
                raise RunDirError(str(e)) from None
        self._lock: RunLock | None = None
        self._answerer: handoff.Answerer | None = None  # rank 0 of a launch with other ranks
        self._used = False
        self._quiet: QuietLightning | None = None  # ModelCheckpoint's warning about the run's own files
        self._own_load: OwnCheckpointLoad | None = None
        twin = self._unused_twin()
        self._resolution: resolve.Resolution = (
            twin._resolution if twin is not None else self._resolve_for_this_rank()
        )
        _LIVE.add(self)
        self._attempts = AttemptRecorder(self.path, code_started=constructed)
        # Processes Lightning's DDP launcher spawns re-run the script with this environment: they adopt it.
        os.environ[ENV["handoff"]] = f"{os.getpid()}:{self._resolution.to_json()}"
        PROCESS.announce(self._resolution)
        log.info("RunDir %s (%s)", self.path, self._resolution.reason)

    def _unused_twin(self) -> RunDir | None:
        """An earlier unused ``RunDir`` of this session in this process (meant for the same Trainer)."""
        if self._session.key is None:
            return None
        for other in list(_LIVE):
            if other.root == self.root and other.session_key == self._session.key and not other._used:
                warn(
                    f"A second RunDir for session {self._session.key!r} under {str(self.root)!r} was "
                    "constructed while the first is still unused; it shares the first one's run dir "
                    f"{str(other.path)!r}. A Trainer takes exactly one RunDir: pass the same object to every "
                    "place that needs it.",
                    all_ranks=True,
                    stacklevel=3,
                )
                return other
        return None

    def _resolve_for_this_rank(self) -> resolve.Resolution:
        launch = launch_key(os.environ)
        if not is_global_zero(os.environ):
            parent, _, payload = os.environ.get(ENV["handoff"], "").partition(":")
            if payload and parent == str(os.getppid()):
                return resolve.Resolution.from_json(payload)
            if launch is not None:
                return handoff.ask(self.root, launch, global_rank(os.environ), self.handoff_timeout)
        resolve.prepare_root(self.root)
        resolution, self._lock = resolve.claim(self.root, self._session)  # decided and locked at once
        weakref.finalize(self, self._lock.release)
        if launch is not None and expects_peers(os.environ):
            try:
                self._answerer = handoff.Answerer(self.root, launch, resolution)
            except RunDirError:
                self._lock.release()
                raise
            weakref.finalize(self, self._answerer.stop)
        return resolution

    @property
    def path(self) -> Path:
        """The run directory."""
        return self._resolution.path

    @property
    def checkpoint_dir(self) -> Path:
        """Where this run's checkpoints live: ``path / "checkpoints"``."""
        return layout.checkpoint_dir(self.path)

    @property
    def run_id(self) -> str:
        """The run's unique id."""
        return self._resolution.run_id

    @property
    def is_resumed(self) -> bool:
        """Whether this process continues an earlier attempt of the run."""
        return self._resolution.is_resumed

    @property
    def session_key(self) -> str | None:
        """The session key this run is recorded under, if any."""
        return self._session.key

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        first = not self._used  # trainer.test() after fit sets up again: the configuration is kept
        self._used = True
        self._check_ranks_agree(trainer)
        redirected = [
            cb
            for cb in trainer.checkpoint_callbacks
            if isinstance(cb, ModelCheckpoint) and cb.dirpath is None
        ]
        for callback in redirected:
            callback.dirpath = str(self.checkpoint_dir)
        if self._quiet is None:
            self._quiet = QuietLightning(self, checkpoint_dir_not_empty(self.checkpoint_dir))
        if redirected and trainer.is_global_zero:
            log.info("ModelCheckpoint(s) without a dirpath now save to %s", self.checkpoint_dir)
        # LightningCLI's configuration into the run dir; Hydra's output dir
        _launcher_config.on_setup(trainer, self.root, self.path, self.run_id, first)
        if stage != "fit":
            # validate/test/predict of the run's own checkpoint (ckpt_path="best"): its hyperparameters
            self._own_load = OwnCheckpointLoad(trainer, self.path)
            self._own_load.install()
        self._attempts.begin(trainer, stage)

    def _check_ranks_agree(self, trainer: pl.Trainer) -> None:
        """Stop answering; raise on every rank when they disagree on the run dir (they would hang)."""
        mine = (self.run_id, str(self.path), self.is_resumed)
        theirs = broadcast(trainer.strategy, mine)
        split = any_rank(trainer.strategy, tuple(theirs) != mine)
        self._stop_answering()
        if split:
            raise RunDirError(
                f"The ranks of this launch do not agree on the run: global rank 0 uses {theirs[1]!r} "
                f"(restart: {theirs[2]}), and at least one rank another one (this rank: {mine[1]!r}, "
                f"restart: {mine[2]}). Training would mix runs or hang. Relaunch the job; if it persists, "
                "check that every rank sees the same runs root and the same scheduler variables.",
                self.path,
            )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and self._session.key is not None and self._resolution.owns_index:
            resolve.check_index(self.root, self._session.key, self.path)
        self._record_status(trainer, RunStatus.RUNNING)
        self._attempts.train_started(trainer)

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._attempts.loaded()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._attempts.step(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._record_status(trainer, RunStatus.FINISHED)
        self._attempts.finished(trainer)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._record_status(trainer, *self._attempts.stopped(trainer, exception))
        self._stop_answering()
        # Keep the lock until exit or the next fit: a save (in a writer process) may still be on its way.
        self._uninstall_own_load()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._uninstall_own_load()
        if stage == "fit":
            self._attempts.refresh(trainer)
            self._release()

    def _uninstall_own_load(self) -> None:
        own_load, self._own_load = self._own_load, None
        if own_load is not None:
            own_load.uninstall()

    def _release(self) -> None:
        """This attempt no longer trains here: another may take the run dir."""
        self._stop_answering()
        if self._lock is not None:
            self._lock.release()

    def _stop_answering(self) -> None:
        answerer, self._answerer = self._answerer, None
        if answerer is not None:
            answerer.stop()

    def _record_status(self, trainer: pl.Trainer, status: RunStatus, detail: str | None = None) -> None:
        """Write ``status.json`` on rank 0; never raises (a full disk must not replace ``fit``'s error)."""
        if not trainer.is_global_zero:
            return
        try:
            write_status(self.path, status, self._attempts.known_step(trainer), detail)
        except OSError as e:
            log.warning("could not record status %r in %s: %s", status.value, self.path, e)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "path": str(self.path)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        stored = state_dict.get("run_id")
        if stored is None or stored == self.run_id:
            return
        if self.is_resumed:
            raise ResumeError(
                f"This restart of run {self.run_id!r} ({str(self.path)!r}) was asked to resume a checkpoint "
                f"of run {stored!r} ({state_dict.get('path')!r}). Refusing to mix two runs: check which "
                "checkpoint is passed to fit(ckpt_path=...) and which run dir the session index points at.",
                self.path,
            )
        log.info("Fresh run %s starts from a checkpoint of run %s", self.run_id, stored)
