"""Make PyTorch Lightning training survive preemption with callbacks added to your own Trainer.

Importing this package has no side effects: it touches no signals, environment or logging, and
imports no tracker.
"""

from lightning_resume._version import __version__
from lightning_resume.durable_checkpoint_io import DurableCheckpointIO
from lightning_resume.exceptions import Preempted, ResumeError, RunDirError
from lightning_resume.preemption_handler import PreemptionHandler
from lightning_resume.requeue_checkpoint import RequeueCheckpoint
from lightning_resume.run_dir import RunDir
from lightning_resume.signal_diagnostics import SignalDiagnostics
from lightning_resume.swanlab_resume import SwanLabResume
from lightning_resume.tracker_resume import TrackerResume
from lightning_resume.trackio_resume import TrackioResume
from lightning_resume.wandb_resume import WandbResume

__all__ = [
    "DurableCheckpointIO",
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
