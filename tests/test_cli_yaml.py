"""A stock ``LightningCLI(Model, Data)`` with RunDir and RequeueCheckpoint in its YAML: a killed job
resumes exactly, with one configuration, saved in the run dir; a restart with a changed configuration
says which keys changed and keeps the earlier file; and YAML builds every public object with every setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import job_env, same_weights

SCRIPT = """
import os, signal
import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LightningCLI
from jobs.train_job import Model, Noisy, loader

class Data(pl.LightningDataModule):
    def train_dataloader(self):
        return loader("stateful", Noisy(), 8, shuffle=True)

class CLIModel(Model):
    def validation_step(self, batch, batch_idx):
        pass

    def on_train_batch_end(self, *args):
        if self.trainer.global_step == int(os.environ.get("KILL_AT", "-1")):
            os.kill(os.getpid(), signal.SIGKILL)

cli = LightningCLI(CLIModel, Data)  # stock: SaveConfigCallback as Lightning sets it up
torch.save(cli.model.state_dict(), os.environ["OUT"])
"""

CONFIG = """
seed_everything: 7
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


def run(
    tmp_path: Path, root: Path, out: Path, *args: str, **env: str | int | None
) -> subprocess.CompletedProcess[str]:
    script, config = tmp_path / "cli.py", tmp_path / f"{root.name}.yaml"
    script.write_text(SCRIPT)
    config.write_text(CONFIG.format(root=root))
    cmd = [sys.executable, str(script), "fit", "--config", str(config), *args]
    return subprocess.run(cmd, env=job_env(OUT=str(out), **env), capture_output=True, text=True, timeout=300)


@pytest.mark.long
@pytest.mark.edge
def test_stock_cli_resumes_exactly_with_its_config_in_the_run_dir(tmp_path: Path) -> None:
    ref = run(tmp_path, tmp_path / "ref", tmp_path / "ref.pt")
    assert ref.returncode == 0, ref.stderr
    out, root = tmp_path / "out.pt", tmp_path / "runs"
    first = run(tmp_path, root, out, SLURM_JOB_ID=61, KILL_AT=10)
    assert first.returncode == -9, first.stderr
    second = run(tmp_path, root, out, SLURM_JOB_ID=61, SLURM_RESTART_COUNT=1)
    assert second.returncode == 0, second.stderr
    assert "Restored all states" in second.stderr + second.stdout
    # An INFO line, shown as Lightning's own are (issue 33), not a warning: nothing to warn about.
    (said,) = [line for line in second.stderr.splitlines() if "configuration is unchanged" in line]
    assert said.startswith("Restart of run") and "Warning" not in said
    assert "changed since its previous attempt" not in second.stderr
    assert same_weights(out, tmp_path / "ref.pt")
    (run_dir,) = root.glob("[0-9]*/[0-9]*/*")
    (ref_dir,) = (tmp_path / "ref").glob("[0-9]*/[0-9]*/*")
    # One configuration per run, in its run dir (Lightning would put it in default_root_dir).
    configs = sorted(tmp_path.rglob("config*.yaml"))
    assert configs == sorted([run_dir / "config.yaml", ref_dir / "config.yaml"]), configs
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["trainer"]["max_epochs"] == 2 and saved["seed_everything"] == 7

    # The same job, extended by hand: a changed configuration is saved, the earlier one kept, and the
    # warning names exactly the keys that changed.
    third = run(
        tmp_path,
        root,
        out,
        "--trainer.max_epochs",
        "3",
        "--ckpt_path",
        "last",
        SLURM_JOB_ID=61,
        SLURM_RESTART_COUNT=2,
    )
    assert third.returncode == 0, third.stderr
    expected = (
        f"RunDir: the LightningCLI configuration of run {run_dir.name!r} changed since its previous attempt: "
        f"trainer.max_epochs: 2 -> 3. The run continues with the new configuration, saved as "
        f"{str(run_dir / 'config.yaml')!r}; the previous one is kept as {str(run_dir / 'config.1.yaml')!r}."
    )
    assert expected in " ".join(third.stderr.split()), third.stderr
    assert third.stderr.count("changed since its previous attempt") == 1
    assert yaml.safe_load((run_dir / "config.1.yaml").read_text())["trainer"]["max_epochs"] == 2
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]["max_epochs"] == 3


EVERY_SETTING = """
trainer:
  max_steps: 1
  limit_val_batches: 0
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {root}
  plugins:
    - class_path: lightning_resume.DurableCheckpointIO
      init_args:
        asynchronous: false
        dirpath: {root}/local
        keep: 2
        metadata: {{experiment: yaml}}
        mirror:
          class_path: lightning_resume.Mirror
          init_args: {{url: "file://{root}/mirror", options: {{auto_mkdir: true}}, wait: false, timeout: 60}}
        memory:
          class_path: lightning_resume.MemoryTier
          init_args: {{path: "{root}/shm", replicas: 2, durable_every: 5, port: 29999, timeout: 30}}
  callbacks:
    - class_path: lightning_resume.RunDir
      init_args: {{root: {root}/runs}}
    - class_path: lightning_resume.ProgressWatchdog
      init_args:
        timeouts:
          step: 1
          first_step: 2
          validation: 3
          epoch_end: 4
          save: 5
          load: 6
          teardown: 7
          multiple: 8
          minimum: 9
          initial: 10
        max_attempts_without_progress: 11
        requeue: false
    - class_path: lightning_resume.RequeueCheckpoint
      init_args:
        every_n_train_steps: auto
        every_n_minutes: 30
        save_on_train_epoch_end: false
        dirpath: {root}/ckpt
        keep_global_batch: true
        expected_interruption_every: "1:00:00"
    - class_path: lightning_resume.PreemptionHandler
      init_args:
        signals: [SIGUSR2]
        requeue: false
        exit_code: 99
        check_every_n_steps: 2
        failure_classes: false
        notices:
          class_path: lightning_resume.notices.Notices
          init_args:
            on_notice: stop
            margin: 5
            sources:
              - class_path: lightning_resume.notices.FileNotice
                init_args: {{path: {root}/notice, interval: 0.5}}
"""

BUILD = """
import sys
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning_resume import PreemptionHandler, ProgressWatchdog, RequeueCheckpoint
cli = LightningCLI(BoringModel, run=False, save_config_callback=None, args=["--config", sys.argv[1]])
io = cli.trainer.strategy.checkpoint_io
(watchdog,) = [c for c in cli.trainer.callbacks if isinstance(c, ProgressWatchdog)]
(checkpoint,) = [c for c in cli.trainer.callbacks if isinstance(c, RequeueCheckpoint)]
(handler,) = [c for c in cli.trainer.callbacks if isinstance(c, PreemptionHandler)]
handler.uninstall()
print(io.settings.asynchronous, io.settings.dirpath.name, io.settings.keep, dict(io.settings.metadata))
print(io.settings.mirror)
print(io.settings.memory)
print(watchdog.timeouts, watchdog.max_attempts_without_progress, watchdog.requeue)
c = checkpoint
print(c.every_n_train_steps, c.every_n_minutes, c.save_on_train_epoch_end, c.checkpoint_dir.name,
      c.keep_global_batch, c.expected_interruption_every)
h = handler
print([s.name for s in h.signals], h.requeue, h.exit_code, h.check_every_n_steps, h.failure_classes)
print(h.notices.on_notice, h.notices.margin, [s.describe() for s in h.notices.sources])
"""


@pytest.mark.edge
def test_yaml_builds_the_plugin_and_the_watchdog_with_every_setting(tmp_path: Path) -> None:
    config, script = tmp_path / "every.yaml", tmp_path / "build.py"
    config.write_text(EVERY_SETTING.format(root=tmp_path))
    script.write_text(BUILD)
    proc = subprocess.run(
        [sys.executable, str(script), str(config)], env=job_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    plugin, mirror, memory, watchdog, checkpoint, handler, notices = proc.stdout.strip().splitlines()[-7:]
    assert plugin == "False local 2 {'experiment': 'yaml'}"
    assert mirror == (
        f"Mirror(url='file://{tmp_path}/mirror', options={{'auto_mkdir': True}}, wait=False, timeout=60.0)"
    )
    assert memory == (
        f"MemoryTier(path=PosixPath('{tmp_path}/shm'), replicas=2, durable_every=5, port=29999, timeout=30.0)"
    )
    assert watchdog == (
        "WatchdogTimeouts(step=1.0, first_step=2.0, validation=3.0, epoch_end=4.0, save=5.0, load=6.0, "
        "teardown=7.0, multiple=8.0, minimum=9.0, initial=10.0) 11 False"
    )
    assert checkpoint == "auto 30.0 False ckpt True 1:00:00"
    assert handler == "['SIGUSR2'] False 99 2 False"
    assert notices == f"stop 5.0 ['file {tmp_path}/notice']"


STRAGGLER = """
trainer:
  logger: false
  callbacks:
    - class_path: lightning_resume.StragglerDetector
      init_args:
        window: 7
        threshold: 0.3
        floor_ms: 20
        patience: 3
        on_straggler: jobs.straggler_job.exclude_node
"""

BUILD_STRAGGLER = """
import sys
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning_resume import StragglerDetector
cli = LightningCLI(BoringModel, run=False, save_config_callback=None, args=["--config", sys.argv[1]])
(found,) = [c for c in cli.trainer.callbacks if isinstance(c, StragglerDetector)]
print(found.window, found.threshold, found.floor_ms, found.patience, found.on_straggler.__name__)
"""


@pytest.mark.edge
def test_yaml_builds_the_straggler_detector_with_every_setting(tmp_path: Path) -> None:
    config, script = tmp_path / "straggler.yaml", tmp_path / "build.py"
    config.write_text(STRAGGLER)
    script.write_text(BUILD_STRAGGLER)
    proc = subprocess.run(
        [sys.executable, str(script), str(config)], env=job_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "7 0.3 20.0 3 exclude_node"
