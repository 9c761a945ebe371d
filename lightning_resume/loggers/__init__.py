"""Lightning loggers shipped by lightning_resume. Importing this package imports no tracker."""

# The loggers keep their identity in tracker sidecars and the tracker callbacks build on the loggers:
# ``trackers`` first, so that importing this package first meets no half-initialised module.
import lightning_resume.trackers  # noqa: F401
from lightning_resume.loggers.comet_logger import CometLogger
from lightning_resume.loggers.mlflow_logger import MLFlowLogger
from lightning_resume.loggers.trackio_logger import TrackioLogger

__all__ = ["CometLogger", "MLFlowLogger", "TrackioLogger"]
