"""The template's ``log_hyperparameters``: parts of the config sent to every logger, before ``fit``."""

from __future__ import annotations

import logging
from typing import Any

from lightning_utilities.core.rank_zero import rank_zero_only
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


@rank_zero_only
def log_hyperparameters(object_dict: dict[str, Any]) -> None:
    cfg = OmegaConf.to_container(object_dict["cfg"])
    assert isinstance(cfg, dict)
    model, trainer = object_dict["model"], object_dict["trainer"]
    if not trainer.logger:
        log.warning("Logger not found! Skipping hyperparameter logging...")
        return
    hparams: dict[str, Any] = {"model": cfg["model"]}
    hparams["model/params/total"] = sum(p.numel() for p in model.parameters())
    hparams["model/params/trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    hparams["model/params/non_trainable"] = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    hparams["data"] = cfg["data"]
    hparams["trainer"] = cfg["trainer"]
    hparams["callbacks"] = cfg.get("callbacks")
    hparams["extras"] = cfg.get("extras")
    hparams["task_name"] = cfg.get("task_name")
    hparams["tags"] = cfg.get("tags")
    hparams["ckpt_path"] = cfg.get("ckpt_path")
    hparams["seed"] = cfg.get("seed")
    for logger in trainer.loggers:
        logger.log_hyperparams(hparams)
