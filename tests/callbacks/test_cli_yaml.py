"""RunDir and RequeueCheckpoint built by LightningCLI from YAML (class_path / init_args) resume too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from conftest import job_env, same_weights

SCRIPT = """
import os, signal, sys
import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LightningCLI
from jobs.train_job import Model, Noisy, loader

class Data(pl.LightningDataModule):
    def train_dataloader(self):
        return loader("stateful", Noisy(), 8, shuffle=True)

class Kill(pl.Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == int(os.environ.get("KILL_AT", "-1")):
            os.kill(os.getpid(), signal.SIGKILL)

class CLIModel(Model):
    def validation_step(self, batch, batch_idx):
        pass

pl.seed_everything(7)
cli = LightningCLI(CLIModel, Data, run=False, save_config_callback=None, seed_everything_default=7)
cli.trainer.callbacks.append(Kill())
cli.trainer.fit(cli.model, datamodule=cli.datamodule)
torch.save(cli.model.state_dict(), os.environ["OUT"])
"""

CONFIG = """
trainer:
  max_epochs: 2
  accelerator: cpu
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  deterministic: true
  default_root_dir: {root}
  callbacks:
    - class_path: lightning_resume.RequeueCheckpoint
      init_args:
        every_n_train_steps: 3
    - class_path: lightning_resume.RunDir
      init_args:
        root: {root}
"""


def run(tmp_path: Path, root: Path, out: Path, **env: str | int | None) -> subprocess.CompletedProcess[str]:
    script, config = tmp_path / "cli.py", tmp_path / f"{root.name}.yaml"
    script.write_text(SCRIPT)
    config.write_text(CONFIG.format(root=root))
    cmd = [sys.executable, str(script), "--config", str(config)]
    return subprocess.run(cmd, env=job_env(OUT=str(out), **env), capture_output=True, text=True, timeout=180)


def test_yaml_configured_callbacks_resume_exactly(tmp_path: Path) -> None:
    ref = run(tmp_path, tmp_path / "ref", tmp_path / "ref.pt")
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "out.pt"
    first = run(tmp_path, tmp_path / "runs", out, SLURM_JOB_ID=61, KILL_AT=10)
    assert first.returncode == -9, first.stderr
    second = run(tmp_path, tmp_path / "runs", out, SLURM_JOB_ID=61, SLURM_RESTART_COUNT=1)
    assert second.returncode == 0, second.stderr
    assert "Restored all states" in second.stderr + second.stdout
    assert same_weights(out, tmp_path / "ref.pt")
    assert torch.load(out).keys()
