"""The template's ``extras``, ``task_wrapper`` and ``get_metric_value`` (without rich and the tag prompt)."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

log = logging.getLogger(__name__)


def extras(cfg: DictConfig) -> None:
    if not cfg.get("extras"):
        log.warning("Extras config not found! <cfg.extras=null>")
        return
    if cfg.extras.get("ignore_warnings"):
        log.info("Disabling python warnings! <cfg.extras.ignore_warnings=True>")
        warnings.filterwarnings("ignore")


def task_wrapper(task_func: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
    @functools.wraps(task_func)
    def wrap(cfg: DictConfig) -> Any:
        try:
            return task_func(cfg)
        except Exception as ex:
            log.exception("")  # the exception into the job's log file
            raise ex
        finally:
            log.info(f"Output dir: {cfg.paths.output_dir}")

    return wrap


def get_metric_value(metric_dict: dict[str, Any], metric_name: str | None) -> float | None:
    if not metric_name:
        log.info("Metric name is None! Skipping metric value retrieval...")
        return None
    if metric_name not in metric_dict:
        raise Exception(f"Metric value not found! <metric_name={metric_name}>")
    return float(metric_dict[metric_name].item())
