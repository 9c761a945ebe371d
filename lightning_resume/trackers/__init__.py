"""Tracker resume: a restarted job continues the tracker run of its first attempt.

One base, :class:`TrackerResume`, owns the hooks; each tracker's callback says how to read its run
identity and how to hand it back. :class:`LocalLoggerResume` does the same for Lightning's
TensorBoard and CSV loggers. Importing this package imports no tracker.
"""

from lightning_resume.trackers.comet_resume import CometResume
from lightning_resume.trackers.local_logger_resume import LocalLoggerResume
from lightning_resume.trackers.mlflow_resume import MLflowResume
from lightning_resume.trackers.swanlab_resume import SwanLabResume
from lightning_resume.trackers.tracker_resume import TrackerResume
from lightning_resume.trackers.trackio_resume import TrackioResume
from lightning_resume.trackers.wandb_resume import WandbResume

__all__ = [
    "CometResume",
    "LocalLoggerResume",
    "MLflowResume",
    "SwanLabResume",
    "TrackerResume",
    "TrackioResume",
    "WandbResume",
]
