"""``TrackerResume``: the shared base of the callbacks that keep a restarted job in its tracker run."""

from __future__ import annotations

import enum
import importlib.util
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from typing_extensions import override

from lightning_resume._checks import missing, the_one
from lightning_resume._warnings import warn
from lightning_resume.run_dir.binding import PROCESS
from lightning_resume.run_dir.resolve import Resolution
from lightning_resume.run_dir.run_dir import RunDir
from lightning_resume.trackers.sidecar import (
    Sidecar,
    check_recorded,
    describe,
    place_conflicts,
    sidecar_path,
    write_sidecar,
)

log = logging.getLogger(__name__)


class Handback(enum.Enum):
    """What binding to the run dir did about the recorded tracker run (``None``: nothing to continue)."""

    MISSING = "missing"  # a restart without a sidecar
    HANDED_BACK = "handed back"  # the tracker's variables now name the recorded run
    DELEGATED = "delegated"  # the tracker's logger picks the recorded run up itself


class TrackerResume(Callback):
    """Keep a restarted job logging to the tracker run its first attempt created.

    Each subclass (:class:`~lightning_resume.WandbResume`, :class:`~lightning_resume.SwanLabResume`,
    ...) says how to find its loggers, read a run's identity and hand a recorded identity back. This
    base owns the hooks:

    - **Bind** (once this callback and the :class:`~lightning_resume.RunDir` exist, in any order): on a
      restart, read ``<run dir>/<tracker>_resume.json`` and, if the next run would go to the recorded
      place, hand the identity back (the tracker's documented environment variables). An unreadable
      sidecar or a changed place gives one warning and a fresh run; the checkpoint resume proceeds.
    - **setup** (just after Lightning created the run): put the environment back, check the created
      run, and write the sidecar.
    - **Every checkpoint**: write the sidecar again, and store the identity in the checkpoint.

    Only rank 0 writes. Several loggers of one tracker must log to one run.

    Raises:
        ModuleNotFoundError: when the tracker is not installed.
        MissingCallbackError: at ``setup`` when no :class:`~lightning_resume.RunDir` was constructed.
        ValueError: at ``setup`` when the trainer logs to several runs of the same tracker.

    Example::

        trainer = Trainer(logger=WandbLogger(project="mnist"), callbacks=[WandbResume(), RunDir()])
    """

    #: Tracker name, for the sidecar file and messages.
    tracker: ClassVar[str] = ""
    #: The tracker package's import name.
    package: ClassVar[str] = ""
    #: The ``lightning-resume`` extra that installs it (default: :attr:`package`).
    extra: ClassVar[str] = ""
    #: Identity fields that say where a run lives.
    place_fields: ClassVar[tuple[str, ...]] = ()
    #: Identity fields a usable sidecar must have.
    required_fields: ClassVar[tuple[str, ...]] = ("id",)
    #: The tracker's variables that decide where a new run goes, recorded in the sidecar.
    placement_env: ClassVar[tuple[str, ...]] = ()
    #: A tracker-specific reason a handed-back identity can be ignored, for the warning.
    handback_caveat: ClassVar[str] = ""
    #: The tracker's Lightning logger class.
    logger_class: ClassVar[type[Logger]]

    def __init__(self) -> None:
        if importlib.util.find_spec(self.package) is None:
            raise ModuleNotFoundError(
                f"{self.package!r} is not installed. Install it with: "
                f'pip install "lightning-resume[{self.extra or self.package}]"'
            )
        self._run_dir: Path | None = None
        self._restart = False
        self._outcome: Handback | None = None
        self._recorded: Sidecar | None = None
        self._environment: dict[str, str | None] = {}
        self._env_before: dict[str, str | None] = {}  # before the hand-back set them
        self._identity: dict[str, Any] | None = None
        self._warned_no_logger = False
        PROCESS.when_ready(self._on_run_dir)

    # -- what each tracker fills in ---------------------------------------------------------------

    def _loggers(self, trainer: pl.Trainer) -> list[Logger]:
        return [logger for logger in trainer.loggers if isinstance(logger, self.logger_class)]

    def _identity_of(self, logger: Any) -> dict[str, Any]:
        """The identity of the run ``logger`` logs to (creating it if needed; rank 0 only)."""
        raise NotImplementedError

    def _expected(self) -> dict[str, Any]:
        """Place fields the next run will certainly have (the explicit arguments)."""
        return {}

    def _hand_back(self, identity: Mapping[str, Any]) -> dict[str, str] | None:
        """The variables that make the tracker continue ``identity`` (``None``: its logger does it)."""
        return None

    @property
    def sidecar_path(self) -> Path | None:
        """``<run dir>/<tracker>_resume.json`` once bound to a run dir, else ``None``."""
        return None if self._run_dir is None else sidecar_path(self._run_dir, self.tracker)

    def _on_run_dir(self, resolution: Resolution) -> None:
        self._run_dir = path = resolution.path
        self._restart = resolution.is_resumed
        self._environment = {name: os.environ.get(name) for name in self.placement_env}
        if not resolution.is_resumed:
            return
        check = check_recorded(
            path, self.tracker, self.required_fields, self._expected(), self.place_fields, self._environment
        )
        if check.error:
            self._warn(
                f"the {self.tracker} sidecar of this restarted run is unusable: {check.error}. Training "
                f"still resumes from its checkpoint, but {self.tracker} starts a new run; the sidecar is "
                "rewritten for it once it exists."
            )
            return
        self._recorded = recorded = check.sidecar
        if recorded is None:
            self._outcome = Handback.MISSING
            log.info(
                "No %s in restarted run %s: a new %s run", check.path.name, resolution.run_id, self.tracker
            )
            return
        if check.conflicts:
            self._warn(
                check.refusal(self.tracker) + " If the change is unintended, restore the original setting "
                "and restart; to follow the new setting on later restarts, do nothing."
            )
            return
        env = self._hand_back(recorded.identity)
        if env is None:
            self._outcome = Handback.DELEGATED
            return
        taken = {
            name: os.environ[name] for name, value in env.items() if os.environ.get(name) not in (None, value)
        }
        if taken:
            self._warn(
                f"not continuing {self.tracker} run {recorded.identity['id']!r}: "
                + ", ".join(f"{name}={value!r}" for name, value in taken.items())
                + f" is already set in the environment and decides the run instead. Unset it to let "
                f"{type(self).__name__} continue the recorded run."
            )
            return
        for name, value in env.items():
            self._env_before.setdefault(name, os.environ.get(name))
            os.environ[name] = value
        self._outcome = Handback.HANDED_BACK
        log.info(
            "Restart of run %s: %s continues run %s (%s)",
            resolution.run_id,
            self.tracker,
            recorded.identity["id"],
            ", ".join(sorted(env)),
        )

    def _restore_env(self) -> None:
        """Put back the hand-back's variables: later runs in this process must not inherit them."""
        for name, value in self._env_before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._env_before.clear()

    def _warn(self, message: str) -> None:
        warn(f"{type(self).__name__}: {message}", all_ranks=True, stacklevel=3)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_env()  # Lightning has created every logger's run by now
        self._use_trainers_run_dir(trainer)
        loggers = self._loggers(trainer)
        if not loggers:
            if trainer.is_global_zero and not self._warned_no_logger:
                self._warned_no_logger = True
                self._warn(f"the Trainer has no {self.tracker} logger, so there is no run to continue.")
            return
        if not trainer.is_global_zero:
            return
        identities = [self._identity_of(logger) for logger in loggers]
        ids = list(dict.fromkeys(identity["id"] for identity in identities))
        if len(ids) > 1:
            raise ValueError(
                f"{type(self).__name__} keeps one {self.tracker} run per training run, but the Trainer's "
                f"{len(loggers)} {self.tracker} loggers log to {len(ids)} different runs "
                f"({', '.join(map(repr, ids))}). Use one {self.tracker} logger, or let them share one run."
            )
        self._identity = identities[0]
        if self._outcome is Handback.HANDED_BACK:
            self._check_continued(self._identity)
        self._write(trainer.global_step)

    def _use_trainers_run_dir(self, trainer: pl.Trainer) -> None:
        run_dir = the_one(trainer, RunDir)
        bound = (self._run_dir, self._restart)
        if run_dir is not None and bound[0] is not None and (run_dir.path, run_dir.is_resumed) != bound:
            # Bound at construction to the RunDir of an earlier Trainer in this process.
            self._warn(
                f"was bound to an earlier RunDir of this process ({str(self._run_dir)!r}), not to the "
                f"Trainer's ({str(run_dir.path)!r}), so the tracker run was chosen for the wrong one. "
                "When a process builds several Trainers, construct each RunDir before the tracker resume "
                "callback. The sidecar goes to the Trainer's run dir."
            )
            self._run_dir = run_dir.path
        if self._run_dir is None:
            raise missing("RunDir", type(self).__name__, "the sidecar lives in the run dir")

    def _check_continued(self, identity: Mapping[str, Any]) -> None:
        assert self._recorded is not None
        recorded = self._recorded.identity
        if identity["id"] != recorded["id"]:
            self._warn(
                f"handed {self.tracker} run {recorded['id']!r} back, but the logger logs to run "
                f"{identity['id']!r}: the run was created before {type(self).__name__} was constructed, the "
                "logger was given an explicit id, or it reused a run already active in this process"
                f"{self.handback_caveat}. The sidecar now records the new run."
            )
            return
        conflicts = place_conflicts(recorded, identity, self.place_fields)
        if conflicts:
            self._warn(
                f"{self.tracker} run {recorded['id']!r} was continued, but the logger placed it elsewhere "
                f"({describe(conflicts)}): settings passed only to the logger are visible once "
                "the run exists. In another project, entity or workspace this is a new run with the same "
                "id. To have such a change refused before the run is created, give the setting to "
                f"{type(self).__name__}(...) too, or set it through the tracker's environment variables."
            )

    def _write(self, global_step: int) -> None:
        path = self.sidecar_path
        if path is None or self._identity is None:
            return
        write_sidecar(path, self.tracker, Sidecar(self._identity, self._environment, global_step))
        log.debug("wrote %s for %s run %s", path, self.tracker, self._identity["id"])

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.is_global_zero:
            self._write(trainer.global_step)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"identity": self._identity}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        stored = state_dict.get("identity")
        live = self._identity
        # Only worth saying when nothing was said at binding: the sidecar was simply gone.
        if self._outcome is not Handback.MISSING or not isinstance(stored, dict) or live is None:
            return
        if stored.get("id") != live["id"]:
            self._warn(
                f"this restart found no {self.tracker} sidecar, so {self.tracker} started run "
                f"{live['id']!r}; the checkpoint was written while logging to run {stored.get('id')!r} "
                f"({stored!r}). The sidecar now records the new run."
            )

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._restore_env()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_env()
