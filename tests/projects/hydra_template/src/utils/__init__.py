from src.utils.instantiators import instantiate_callbacks, instantiate_loggers
from src.utils.logging_utils import log_hyperparameters
from src.utils.utils import extras, get_metric_value, task_wrapper

__all__ = [
    "extras",
    "get_metric_value",
    "instantiate_callbacks",
    "instantiate_loggers",
    "log_hyperparameters",
    "task_wrapper",
]
