"""Make PyTorch Lightning training survive preemption with callbacks added to your own Trainer.

Every public name is here (notice sources in ``notices``, loggers in ``loggers``). Importing it has no side
effects and imports no tracker, nor Lightning or torch until a name needs them (a fast command line).
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
    from lightning_resume.io.durable_checkpoint_io import DurableCheckpointIO
    from lightning_resume.io.memory.memory_tier import MemoryTier
    from lightning_resume.io.restore import Restore
    from lightning_resume.io.settings import CheckpointSettings, Mirror
    from lightning_resume.io.write_stats import WriteStats
    from lightning_resume.last_ckpt.requeue_checkpoint import RequeueCheckpoint
    from lightning_resume.preemption.preemption_handler import PreemptionHandler
    from lightning_resume.preemption.signal_diagnostics import SignalDiagnostics
    from lightning_resume.preemption.stop_state import StopReport
    from lightning_resume.run_dir.run_dir import RunDir
    from lightning_resume.straggler.decision import Straggler
    from lightning_resume.straggler.straggler_detector import StragglerDetector
    from lightning_resume.trackers.comet_resume import CometResume
    from lightning_resume.trackers.local_logger_resume import LocalLoggerResume
    from lightning_resume.trackers.mlflow_resume import MLflowResume
    from lightning_resume.trackers.swanlab_resume import SwanLabResume
    from lightning_resume.trackers.tracker_resume import TrackerResume
    from lightning_resume.trackers.trackio_resume import TrackioResume
    from lightning_resume.trackers.wandb_resume import WandbResume
    from lightning_resume.watchdog.progress_watchdog import ProgressWatchdog
    from lightning_resume.watchdog.timeouts import WatchdogTimeouts

#: The public names that need Lightning, and their modules (imported on first use).
_LAZY = {
    "CheckpointSettings": "lightning_resume.io.settings",
    "DurableCheckpointIO": "lightning_resume.io.durable_checkpoint_io",
    "MemoryTier": "lightning_resume.io.memory.memory_tier",
    "Mirror": "lightning_resume.io.settings",
    "PreemptionHandler": "lightning_resume.preemption.preemption_handler",
    "ProgressWatchdog": "lightning_resume.watchdog.progress_watchdog",
    "RequeueCheckpoint": "lightning_resume.last_ckpt.requeue_checkpoint",
    "Restore": "lightning_resume.io.restore",
    "RunDir": "lightning_resume.run_dir.run_dir",
    "SignalDiagnostics": "lightning_resume.preemption.signal_diagnostics",
    "StopReport": "lightning_resume.preemption.stop_state",
    "Straggler": "lightning_resume.straggler.decision",
    "StragglerDetector": "lightning_resume.straggler.straggler_detector",
    "CometResume": "lightning_resume.trackers.comet_resume",
    "LocalLoggerResume": "lightning_resume.trackers.local_logger_resume",
    "MLflowResume": "lightning_resume.trackers.mlflow_resume",
    "SwanLabResume": "lightning_resume.trackers.swanlab_resume",
    "TrackerResume": "lightning_resume.trackers.tracker_resume",
    "TrackioResume": "lightning_resume.trackers.trackio_resume",
    "WandbResume": "lightning_resume.trackers.wandb_resume",
    "WatchdogTimeouts": "lightning_resume.watchdog.timeouts",
    "WriteStats": "lightning_resume.io.write_stats",
}


def __getattr__(name: str) -> Any:
    if name == "notices":  # the subpackage, imported on first use too
        value: Any = importlib.import_module(f"{__name__}.notices")
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once imported, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "notices"})


__all__ = [
    "CheckpointSettings",
    "CheckpointVerificationError",
    "CometResume",
    "CrashLoopStopped",
    "DurableCheckpointIO",
    "LightningResumeError",
    "LightningResumeWarning",
    "LocalLoggerResume",
    "MLflowResume",
    "MemoryTier",
    "Mirror",
    "MissingCallbackError",
    "Preempted",
    "PreemptionHandler",
    "ProgressWatchdog",
    "RequeueCheckpoint",
    "Restore",
    "ResumeError",
    "RunDir",
    "RunDirError",
    "SignalDiagnostics",
    "StopReport",
    "Straggler",
    "StragglerDetector",
    "SwanLabResume",
    "TrackerResume",
    "TrackioResume",
    "WandbResume",
    "WatchdogTimeouts",
    "WriteStats",
    "__version__",
    "notices",
]
