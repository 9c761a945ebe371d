"""Make PyTorch Lightning training survive preemption with callbacks added to your own Trainer.

The package is organised as its architecture: ``callbacks`` (run dir, ``last.ckpt`` and resume,
preemption, diagnostics), ``notices`` (preemption notices), ``trackers`` (tracker resume),
``loggers``, ``io`` (the checkpoint plugin), ``cli``; the private ``_run``, ``_resume`` and
``_writer`` hold the logic they share. Every public name is importable from here (the notice sources
from ``lightning_resume.notices``).

Importing this package has no side effects: it touches no signals, environment or logging, and
imports no tracker. Nor does it import Lightning or torch until a name that needs them is used: the
``lightning-resume`` command line (``inspect``, ``gc``, ``doctor``) starts in well under a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_resume._version import __version__
from lightning_resume.exceptions import (
    CheckpointVerificationError,
    CrashLoopStopped,
    LightningResumeError,
    LightningResumeWarning,
    MissingCallbackError,
    Preempted,
    ResumeError,
    RunDirError,
)

if TYPE_CHECKING:
    from lightning_resume import notices
    from lightning_resume.callbacks import (
        PreemptionHandler,
        ProgressWatchdog,
        RequeueCheckpoint,
        RunDir,
        SignalDiagnostics,
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

#: The public names that need Lightning, and the subpackage each comes from (imported on first use).
_LAZY = {
    "PreemptionHandler": "lightning_resume.callbacks",
    "ProgressWatchdog": "lightning_resume.callbacks",
    "RequeueCheckpoint": "lightning_resume.callbacks",
    "RunDir": "lightning_resume.callbacks",
    "SignalDiagnostics": "lightning_resume.callbacks",
    "DurableCheckpointIO": "lightning_resume.io",
    "CometResume": "lightning_resume.trackers",
    "LocalLoggerResume": "lightning_resume.trackers",
    "MLflowResume": "lightning_resume.trackers",
    "SwanLabResume": "lightning_resume.trackers",
    "TrackerResume": "lightning_resume.trackers",
    "TrackioResume": "lightning_resume.trackers",
    "WandbResume": "lightning_resume.trackers",
}


#: Subpackages reachable as attributes (``lightning_resume.notices.AwsSpotNotice``), imported on first use.
_SUBPACKAGES = ("notices",)


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        subpackage = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = subpackage
        return subpackage
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once imported, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBPACKAGES})


__all__ = [
    "CheckpointVerificationError",
    "CometResume",
    "CrashLoopStopped",
    "DurableCheckpointIO",
    "LightningResumeError",
    "LightningResumeWarning",
    "LocalLoggerResume",
    "MLflowResume",
    "MissingCallbackError",
    "Preempted",
    "PreemptionHandler",
    "ProgressWatchdog",
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
    "notices",
]
