"""train.py's model and data under LightningCLI; the Trainer and its callbacks come from cli.yaml.

python cli_train.py fit --config cli.yaml
python cli_train.py fit --config cli.yaml --trainer.max_steps 5000 --model.lr 0.003
"""

from __future__ import annotations

import logging

from lightning.pytorch.cli import LightningCLI
from train import Regression, RegressionData


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A restart saves the configuration again into the same folder (logger: false puts it in
    # default_root_dir): allow the overwrite.
    LightningCLI(Regression, RegressionData, save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
