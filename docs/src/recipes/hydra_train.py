"""train.py's model and data as a Hydra application: callbacks and plugin come from hydra_train.yaml.

    python hydra_train.py
    LIGHTNING_RESUME_KEY=exp-1 python hydra_train.py max_steps=400
    python hydra_train.py -m hydra/launcher=submitit_slurm hydra.launcher.partition=gpu

Run it from the folder that holds train.py and hydra_train.yaml. The run dir lives under the launch
folder (`${hydra:runtime.cwd}/runs`), not in Hydra's output dir, which is new for every launch.
"""

from __future__ import annotations

import hydra
import lightning.pytorch as pl
from hydra.utils import instantiate
from omegaconf import DictConfig

from lightning_resume import RunDir


@hydra.main(version_base="1.3", config_path=".", config_name="hydra_train")
def main(cfg: DictConfig) -> None:
    pl.seed_everything(cfg.seed)
    # As lightning-hydra-template's instantiate_callbacks: one callback per entry.
    callbacks = [instantiate(callback) for callback in cfg.callbacks.values()]
    run_dir = next(callback for callback in callbacks if isinstance(callback, RunDir))
    # Lightning's own logs (the default logger) go into the run dir too.
    trainer = instantiate(cfg.trainer, callbacks=callbacks, default_root_dir=run_dir.path)
    trainer.fit(instantiate(cfg.model), datamodule=instantiate(cfg.data))
    if trainer.is_global_zero:
        print(f"finished at step {trainer.global_step} in {run_dir.path}")


if __name__ == "__main__":
    main()
