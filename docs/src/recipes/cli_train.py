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
    # Stock LightningCLI: RunDir saves the configuration in the run dir and compares it on a restart.
    LightningCLI(Regression, RegressionData)


if __name__ == "__main__":
    main()
