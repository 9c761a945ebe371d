"""Make PyTorch Lightning training survive preemption with callbacks added to your own Trainer.

Importing this package has no side effects: it touches no signals, environment or logging, and
imports no tracker.
"""

from lightning_resume._version import __version__
from lightning_resume.exceptions import ResumeError, RunDirError
from lightning_resume.requeue_checkpoint import RequeueCheckpoint
from lightning_resume.run_dir import RunDir

__all__ = ["RequeueCheckpoint", "ResumeError", "RunDir", "RunDirError", "__version__"]
