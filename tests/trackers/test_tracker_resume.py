"""What the three tracker resume callbacks share: import hygiene, YAML configuration, no network, binding."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from _tracker_data import (
    dead_network_env,
    fit_tiny,
    offline_env,
    swanlab_runs,
    trackio_dir_for_tests,
    trackio_rows,
    wandb_runs,
)
from conftest import job_env

from lightning_resume import ResumeError, RunDir, TrackioResume
from lightning_resume.loggers import TrackioLogger

trackio_dir_for_tests()

SCRIPT = """
import os, signal
import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset
import torch
from jobs.tracker_job import BATCH, Model

class Data(pl.LightningDataModule):
    def train_dataloader(self):
        x = torch.randn(12 * BATCH, 8, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH)

class Preempt(pl.Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == int(os.environ.get("KILL_AT", "-1")):
            os.kill(os.getpid(), signal.SIGTERM)

cli = LightningCLI(Model, Data, run=False, save_config_callback=None)
cli.trainer.callbacks.append(Preempt())
cli.trainer.fit(cli.model, datamodule=cli.datamodule)
open("finished", "w").close()
"""

# Loggers first, resume callbacks before RunDir: the orders the binding must cope with.
CONFIG = """
trainer:
  max_steps: 12
  accelerator: cpu
  log_every_n_steps: 1
  enable_progress_bar: false
  enable_model_summary: false
  limit_val_batches: 0
  logger:
    - class_path: lightning.pytorch.loggers.WandbLogger
      init_args: {project: yaml-test, save_dir: trackers}
    - class_path: swanlab.integration.pytorch_lightning.SwanLabLogger
      init_args: {project: yaml-test, log_dir: trackers/swanlog}
    - class_path: lightning_resume.loggers.TrackioLogger
      init_args: {project: yaml-test, auto_log_cpu: false}
  callbacks:
    - class_path: lightning_resume.WandbResume
    - class_path: lightning_resume.SwanLabResume
      init_args: {project: yaml-test}
    - class_path: lightning_resume.TrackioResume
    - class_path: lightning_resume.RequeueCheckpoint
      init_args: {every_n_train_steps: 4}
    - class_path: lightning_resume.RunDir
      init_args: {root: runs}
"""


@pytest.fixture
def listener() -> Iterator[tuple[str, list[bytes]]]:
    """A local port that records every connection made to it; nothing is ever answered."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    seen: list[bytes] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.settimeout(1)
            try:
                seen.append(conn.recv(200))
            except OSError:
                seen.append(b"")
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", seen
    server.close()


def test_the_listener_sees_what_the_dead_network_environment_sends(listener: tuple[str, list[bytes]]) -> None:
    """The control for the no-network check: traffic under that environment does reach the listener."""
    url, seen = listener
    code = (
        "import urllib.request\n"
        "try: urllib.request.urlopen('http://example.com', timeout=5)\n"
        "except Exception: pass\n"
    )
    subprocess.run([sys.executable, "-c", code], env=job_env(**dead_network_env(url)), timeout=60)
    assert seen and b"example.com" in seen[0]


@pytest.mark.long
def test_yaml_configured_trackers_continue_their_runs_without_touching_the_network(
    tmp_path: Path, listener: tuple[str, list[bytes]]
) -> None:
    url, seen = listener
    (tmp_path / "cli.py").write_text(SCRIPT)
    (tmp_path / "config.yaml").write_text(CONFIG)
    env = {
        **offline_env(tmp_path),
        **dead_network_env(url),
        "SLURM_JOB_ID": "61",
    }
    cmd = [sys.executable, "cli.py", "--config", "config.yaml"]
    for attempt, kill in enumerate([7, None]):
        restart = {"SLURM_RESTART_COUNT": str(attempt)} if attempt else {}
        kill_at = {"KILL_AT": str(kill)} if kill is not None else {}
        proc = subprocess.run(
            cmd,
            cwd=tmp_path,
            env=job_env(**env, **restart, **kill_at),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (tmp_path / "finished").exists() == (kill is None), proc.stdout + proc.stderr
    assert seen == [], f"a tracker tried the network: {seen}"

    first, second = wandb_runs(tmp_path / "trackers")
    assert first.run_id == second.run_id
    steps = [[row["trainer/global_step"] for row in run.history] for run in (first, second)]
    assert steps == [list(range(7)), list(range(7, 12))]

    swan = swanlab_runs(tmp_path / "trackers" / "swanlog")
    assert len({(run.run_id, run.name) for run in swan}) == 1 and len(swan) == 2
    assert [[step for step, _ in run.scalars["echo"]] for run in swan] == steps

    rows = trackio_rows(tmp_path / "trackio", "yaml-test")
    assert len({row.run_id for row in rows}) == 1
    assert [row.step for row in rows] == list(range(12))


def test_importing_the_package_imports_no_tracker() -> None:
    code = (
        "import sys\n"
        "import lightning_resume, lightning_resume.loggers\n"
        "from lightning_resume import SwanLabResume, TrackioResume, WandbResume\n"
        "from lightning_resume.loggers import TrackioLogger\n"
        "keep = [WandbResume(), SwanLabResume(), TrackioResume(), TrackioLogger(project='p')]\n"
        "heavy = sorted(m for m in ('wandb', 'trackio', 'swanlab') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("name", "package", "extra"),
    [
        ("WandbResume", "wandb", "wandb"),
        ("SwanLabResume", "swanlab", "swanlab"),
        ("TrackioResume", "trackio", "trackio"),
        ("MLflowResume", "mlflow", "mlflow"),
        ("CometResume", "comet_ml", "comet"),
    ],
)
def test_missing_tracker_gives_the_install_command_of_a_declared_extra(
    monkeypatch: pytest.MonkeyPatch, name: str, package: str, extra: str
) -> None:
    import tomllib

    import lightning_resume

    pyproject = Path(lightning_resume.__file__).parent.parent / "pyproject.toml"
    assert extra in tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    monkeypatch.setitem(sys.modules, package, None)  # what the import system reports for a missing package
    with pytest.raises(ModuleNotFoundError, match=rf'pip install "lightning-resume\[{extra}\]"'):
        getattr(lightning_resume, name)()


def test_without_a_run_dir_setup_explains_what_is_missing(tmp_path: Path) -> None:
    import lightning.pytorch as pl
    import torch
    from jobs.tracker_job import Model

    trainer = pl.Trainer(
        max_steps=1,
        logger=TrackioLogger(project="no-run-dir", auto_log_cpu=False),
        callbacks=[TrackioResume()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 8), torch.ones(4, 1)))
    with pytest.raises(ResumeError, match="TrackioResume needs a RunDir callback"):
        trainer.fit(Model(), train_dataloaders=data)


def test_callback_bound_to_an_earlier_run_dir_of_the_process_says_so(tmp_path: Path) -> None:
    RunDir(root=tmp_path / "earlier")  # e.g. the previous Trainer of a notebook
    resume = TrackioResume()
    with pytest.warns(UserWarning, match="was bound to an earlier RunDir of this process"):
        fit_tiny(tmp_path, TrackioLogger(project="stale-binding", auto_log_cpu=False), resume, steps=1)
    assert next(tmp_path.glob("[0-9]*/[0-9]*/*/trackio_resume.json"))
