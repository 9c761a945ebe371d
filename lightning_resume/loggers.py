"""Lightning loggers shipped by lightning_resume. Importing this package imports no tracker."""

from lightning_resume.trackers.loggers.comet_logger import CometLogger
from lightning_resume.trackers.loggers.mlflow_logger import MLFlowLogger
from lightning_resume.trackers.loggers.trackio_logger import TrackioLogger

__all__ = ["CometLogger", "MLFlowLogger", "TrackioLogger"]
