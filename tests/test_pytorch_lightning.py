"""``lightning_resume.pytorch_lightning``: the same callbacks and plugin for projects on
``import pytorch_lightning as pl``, pinned by an exact resume against the ``pytorch-lightning`` package."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import job_env, same_weights

pl = pytest.importorskip("pytorch_lightning")

import lightning_resume  # noqa: E402

pytestmark = pytest.mark.edge  # run again on the lowest Lightning and torch declared


def run(root: Path, out: Path, *args: str | int, **env: str | int) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "jobs.pl_job", "--root", str(root), "--out", str(out), *map(str, args)]
    return subprocess.run(cmd, env=job_env(**env), capture_output=True, text=True, timeout=300)


@pytest.mark.long
def test_a_pytorch_lightning_job_resumes_exactly_after_sigkill(tmp_path: Path) -> None:
    ref = run(tmp_path / "ref", tmp_path / "ref.pt", LIGHTNING_RESUME_KEY="ref")
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "out.pt"
    first = run(tmp_path / "runs", out, "--kill-at", 7, LIGHTNING_RESUME_KEY="pl")
    assert first.returncode == -9, first.stderr
    # pytorch_lightning's Trainer sees RequeueCheckpoint as its own checkpoint callback: no default
    # ModelCheckpoint is added, and ckpt_path=None becomes the last.ckpt to resume from.
    assert (
        "checkpoint callbacks: ['lightning_resume.pytorch_lightning.last_ckpt.requeue_checkpoint']"
        in first.stdout
    )
    second = run(tmp_path / "runs", out, LIGHTNING_RESUME_KEY="pl")
    assert second.returncode == 0, second.stderr
    assert "Restored all states from the checkpoint" in second.stderr + second.stdout
    assert same_weights(out, tmp_path / "ref.pt")
    (run_dir,) = (tmp_path / "runs").glob("[0-9]*/[0-9]*/*")
    assert list((tmp_path / "runs").rglob("*.ckpt")) == [run_dir / "checkpoints" / "last.ckpt"]
    assert sorted(p.name for p in (tmp_path / "runs" / "lightning_logs").iterdir()) == ["version_0"]


def test_every_public_name_is_built_on_pytorch_lightning() -> None:
    import lightning.pytorch
    import lightning_fabric

    mirror = importlib.import_module("lightning_resume.pytorch_lightning")
    assert mirror.__all__ == lightning_resume.__all__
    assert issubclass(mirror.RequeueCheckpoint, pl.callbacks.OnExceptionCheckpoint)
    assert issubclass(mirror.DurableCheckpointIO, lightning_fabric.plugins.CheckpointIO)
    for name in mirror.__all__:
        value = getattr(mirror, name)
        if isinstance(value, type) and issubclass(value, lightning.pytorch.Callback):
            raise AssertionError(f"{name} is a lightning.pytorch callback")
        if isinstance(value, type) and issubclass(value, pl.Callback):
            assert value.__module__.startswith("lightning_resume.pytorch_lightning."), value
    # One family of errors and warnings for both packages.
    assert mirror.ResumeError is lightning_resume.ResumeError
    assert mirror.LightningResumeWarning is lightning_resume.LightningResumeWarning
    from lightning_resume.pytorch_lightning.loggers import MLFlowLogger

    assert issubclass(MLFlowLogger, pl.loggers.MLFlowLogger)
