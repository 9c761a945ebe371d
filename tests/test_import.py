from __future__ import annotations

import subprocess
import sys


def test_import_has_no_side_effects() -> None:
    code = (
        "import logging, os, signal, sys\n"
        "import lightning.pytorch  # sets env vars of its own; only lightning_resume is under test\n"
        "env = dict(os.environ)\n"
        "handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)]\n"
        "import lightning_resume, lightning_resume.loggers\n"
        "heavy = ('wandb', 'trackio', 'swanlab', 'submitit', 's3fs', 'mlflow', 'comet_ml', 'hydra',\n"
        "         'tensorboard', 'pytorch_lightning', 'lightning.pytorch.cli')\n"
        "heavy = sorted(m for m in heavy if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "assert dict(os.environ) == env\n"
        "assert handlers == [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)]\n"
        "assert not logging.getLogger().handlers\n"
        "assert lightning_resume.__all__ == sorted(lightning_resume.__all__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
