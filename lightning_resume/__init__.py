"""Make PyTorch Lightning training survive preemption with callbacks added to your own Trainer.

The package is organised as its architecture: ``callbacks`` (run dir, ``last.ckpt`` and resume,
preemption, diagnostics), ``trackers`` (tracker resume), ``loggers``, ``io`` (the checkpoint plugin),
``cli``; the private ``_run``, ``_resume`` and ``_writer`` hold the logic they share. Every public name
is importable from here.

Importing this package has no side effects: it touches no signals, environment or logging, and
imports no tracker.
"""

from lightning_resume._version import __version__
from lightning_resume.callbacks import PreemptionHandler, RequeueCheckpoint, RunDir, SignalDiagnostics
from lightning_resume.exceptions import (
    CheckpointVerificationError,
    LightningResumeError,
    LightningResumeWarning,
    MissingCallbackError,
    Preempted,
    ResumeError,
    RunDirError,
)
from lightning_resume.io import DurableCheckpointIO
from lightning_resume.trackers import (
    CometResume,
    LocalLoggerResume,
    MLflowResume,
    SwanLabResume,
    TrackerResume,
    TrackioResume,
    WandbResume,
)

__all__ = [
    "CheckpointVerificationError",
    "CometResume",
    "DurableCheckpointIO",
    "LightningResumeError",
    "LightningResumeWarning",
    "LocalLoggerResume",
    "MLflowResume",
    "MissingCallbackError",
    "Preempted",
    "PreemptionHandler",
    "RequeueCheckpoint",
    "ResumeError",
    "RunDir",
    "RunDirError",
    "SignalDiagnostics",
    "SwanLabResume",
    "TrackerResume",
    "TrackioResume",
    "WandbResume",
    "__version__",
]
