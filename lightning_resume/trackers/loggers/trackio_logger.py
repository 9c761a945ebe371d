"""``TrackioLogger``: a Lightning logger for trackio, which continues its run after a restart."""

from __future__ import annotations

import logging
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from typing_extensions import override

from lightning_resume._warnings import warn
from lightning_resume.trackers.sidecar import to_continue

log = logging.getLogger(__name__)

TRACKER = "trackio"
#: Where a trackio run lives (``url`` is only recorded: trackio rewrites the ``space_id`` it is given).
PLACE_FIELDS = ("project", "dir")

Resume = Literal["never", "allow", "must"]


def import_trackio() -> Any:
    """Import trackio, or fail with the install command."""
    try:
        import trackio
    except ImportError as e:
        raise ModuleNotFoundError(
            'trackio is not installed. Install it with: pip install "lightning-resume[trackio]"'
        ) from e
    return trackio


def storage_dir() -> Path:
    """``trackio.utils.TRACKIO_DIR``: its local databases, read from the variable at trackio's import."""
    return Path(import_trackio().utils.TRACKIO_DIR).expanduser().resolve()


def run_ids_named(project: str, name: str) -> list[str]:
    """Ids of the runs called ``name`` in the local database of ``project`` (trackio's public ``Api``)."""
    try:
        runs = import_trackio().Api().runs(project)
    except ValueError:  # no such project yet
        return []
    return [str(run.id) for run in runs if run.name == name]


class TrackioLogger(Logger):
    """Log metrics and hyperparameters to `trackio <https://github.com/gradio-app/trackio>`_.

    ``name`` is the trackio project and ``version`` the run name. The run is created at the first
    ``experiment`` (when ``fit`` starts) and finished by ``finalize``; used again afterwards
    (``trainer.test`` after ``fit``), the logger continues the same run.

    trackio continues a run by *name*. A fresh start follows ``resume``. On a restart of a
    :class:`~lightning_resume.RunDir` whose :class:`~lightning_resume.TrackioResume` recorded a run, the
    logger continues that run when the project and storage dir (``TRACKIO_DIR``, read when trackio is
    first imported: set it before the first ``experiment``) are the recorded ones and no other run of
    the project has its name; otherwise it warns and creates a new run. An explicit other ``name`` wins.

    Args:
        project: The trackio project.
        name: The run name (trackio generates one when ``None``).
        group: The run's group in the dashboard.
        resume: trackio's rule for a fresh start: ``"never"`` (a new run), ``"allow"`` (continue the run
            called ``name`` if any) or ``"must"``.
        prefix: A string put before every metric key, joined with ``"-"``.
        space_id: A Hugging Face Space to log to (``None``: local only, or ``TRACKIO_SPACE_ID``).
        auto_log_cpu: Log CPU and memory use in the background (``None``: trackio decides).
        auto_log_gpu: Log GPU use in the background (``None``: trackio decides).
        **init_kwargs: Further ``trackio.init`` arguments (from Python; YAML takes the named ones).

    Raises:
        ModuleNotFoundError: when trackio is not installed (at the first ``experiment``).
        ValueError: for an empty ``project`` or an unknown ``resume``.

    Example::

        from lightning_resume.loggers import TrackioLogger

        callbacks = [RunDir(root="runs"), TrackioResume(), RequeueCheckpoint()]
        trainer = Trainer(logger=TrackioLogger(project="mnist"), callbacks=callbacks)
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        project: str,
        name: str | None = None,
        group: str | None = None,
        resume: Resume = "never",
        prefix: str = "",
        space_id: str | None = None,
        auto_log_cpu: bool | None = None,
        auto_log_gpu: bool | None = None,
        **init_kwargs: Any,
    ) -> None:
        if not project:
            raise ValueError(f"project must be a non-empty string, got {project!r}.")
        if resume not in ("never", "allow", "must"):
            raise ValueError(f"resume must be 'never', 'allow' or 'must', got {resume!r}.")
        super().__init__()
        self._project = project
        self._name = name
        self._group = group
        self._resume = resume
        self._prefix = prefix
        explicit = {"space_id": space_id, "auto_log_cpu": auto_log_cpu, "auto_log_gpu": auto_log_gpu}
        self._init_kwargs = {**{k: v for k, v in explicit.items() if v is not None}, **init_kwargs}
        self._experiment: Any = None
        self._finished_name: str | None = None

    @property
    @override
    def name(self) -> str:
        """The trackio project."""
        return self._project

    @property
    @override
    def version(self) -> str | None:
        """The run name (``None`` until trackio has generated one, when no ``name`` was given)."""
        if self._experiment is not None:
            return str(self._experiment.name)
        return self._finished_name or self._name

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``trackio.Run``, created on first use (rank 0; other ranks get a no-op object)."""
        if self._experiment is None:
            trackio = import_trackio()
            name, resume, recorded = self._choose_run()
            self._experiment = trackio.init(
                project=self._project, name=name, group=self._group, resume=resume, **self._init_kwargs
            )
            if recorded is not None and self._experiment.id != recorded["id"]:
                warn(
                    f"TrackioLogger: the recorded trackio run {recorded['name']!r} (id {recorded['id']!r}) "
                    f"was not found in project {self._project!r} under {str(storage_dir())!r}; logging to a "
                    f"new run with id {self._experiment.id!r}.",
                    all_ranks=True,
                )
        return self._experiment

    def _choose_run(self) -> tuple[str | None, Resume, dict[str, Any] | None]:
        """``(name, resume, recorded identity)`` for ``trackio.init``."""
        if self._finished_name is not None:
            return self._finished_name, "allow", None
        default: tuple[str | None, Resume, dict[str, Any] | None] = (self._name, self._resume, None)

        def now() -> dict[str, Any]:
            return {"project": self._project, "dir": str(storage_dir())}

        found = to_continue(TRACKER, ("id", "name"), now, PLACE_FIELDS, "TrackioLogger", stacklevel=3)
        if found is None:
            return default
        resolution, _, identity = found
        if self._name is not None and self._name != identity["name"]:
            log.info("Explicit trackio run name %r wins over the recorded %r", self._name, identity["name"])
            return default
        others = sorted(set(run_ids_named(self._project, identity["name"])) - {identity["id"]})
        if others:
            # trackio resumes the newest run with a name: that could be one of these, not the recorded one.
            warn(
                f"TrackioLogger: not continuing trackio run {identity['name']!r} (id {identity['id']!r}): "
                f"project {self._project!r} also has run(s) {others} with that name, and trackio continues a "
                "run by name, so it could write into one of them. A new run is created instead; rename the "
                "other run(s) to continue the recorded one on the next restart.",
                all_ranks=True,
                stacklevel=3,
            )
            return default
        log.info("Restart of run %s: trackio continues run %s", resolution.run_id, identity["name"])
        return str(identity["name"]), "allow", identity

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self._prefix:
            metrics = {f"{self._prefix}{self.LOGGER_JOIN_CHAR}{key}": value for key, value in metrics.items()}
        self.experiment.log(dict(metrics), step=step)

    @override
    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        items = vars(params) if isinstance(params, Namespace) else dict(params)
        # Callables (a class, a function) by name.
        self.experiment.config.update(
            {str(k): getattr(v, "__name__", repr(v)) if callable(v) else v for k, v in items.items()}
        )

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._experiment is None:
            return
        self._finished_name = str(self._experiment.name)
        self._experiment.finish()
        self._experiment = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_experiment"] = None  # a trackio run cannot be pickled (spawned processes)
        return state
