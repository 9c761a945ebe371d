from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from conftest import tiny_trainer as trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import RequeueCheckpoint, ResumeError, RunDir, RunDirError
from lightning_resume.run_dir.resolve import index_path


def test_model_checkpoint_without_dirpath_goes_to_run_dir(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = RunDir(root=tmp_path / "runs")
    mine, theirs = ModelCheckpoint(), ModelCheckpoint(dirpath=tmp_path / "mine", monitor="step", mode="max")
    caplog.set_level(logging.INFO, logger="lightning_resume")
    trainer(mine, theirs, run_dir, tmp_path=tmp_path).fit(BoringModel())
    assert [p.parent for p in run_dir.checkpoint_dir.glob("epoch=*.ckpt")] == [run_dir.checkpoint_dir]
    assert list((tmp_path / "mine").glob("epoch=*.ckpt"))
    assert "without a dirpath now save to" in caplog.text


def test_run_dir_is_stored_in_checkpoints(tmp_path: Path) -> None:
    run_dir = RunDir(root=tmp_path / "runs")
    trainer(run_dir, RequeueCheckpoint(), tmp_path=tmp_path).fit(BoringModel())
    ckpt = torch.load(run_dir.checkpoint_dir / "last.ckpt", weights_only=True)
    assert ckpt["callbacks"]["RunDir"] == {"run_id": run_dir.run_id, "path": str(run_dir.path)}


def test_guard_refuses_to_train_when_index_points_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "900")
    run_dir = RunDir(root=tmp_path / "runs")
    index_path(run_dir.root, "900").write_text(str(tmp_path / "elsewhere"))
    model = BoringModel()
    with pytest.raises(RunDirError, match="should point at this run"):
        trainer(run_dir, tmp_path=tmp_path).fit(model)


def test_restart_refuses_a_checkpoint_of_another_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = RunDir(root=tmp_path / "other")
    trainer(other, RequeueCheckpoint(), tmp_path=tmp_path).fit(BoringModel())
    monkeypatch.setenv("SLURM_JOB_ID", "901")
    first = RunDir(root=tmp_path / "runs")
    trainer(first, RequeueCheckpoint(), tmp_path=tmp_path).fit(BoringModel())
    # Someone copies another run's last.ckpt into this run's checkpoint dir.
    (first.checkpoint_dir / "last.ckpt").write_bytes((other.checkpoint_dir / "last.ckpt").read_bytes())
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    again = RunDir(root=tmp_path / "runs")
    with pytest.raises(ResumeError, match="Refusing to mix two runs"):
        trainer(again, RequeueCheckpoint(), tmp_path=tmp_path, max_epochs=2).fit(BoringModel())


def test_fresh_run_may_start_from_another_runs_checkpoint(tmp_path: Path) -> None:
    other = RunDir(root=tmp_path / "other")
    trainer(other, RequeueCheckpoint(), tmp_path=tmp_path).fit(BoringModel())
    fresh = RunDir(root=tmp_path / "runs")
    t = trainer(fresh, RequeueCheckpoint(), tmp_path=tmp_path, max_epochs=2)
    t.fit(BoringModel(), ckpt_path=other.checkpoint_dir / "last.ckpt")
    assert t.global_step == 8


def test_bad_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="handoff_timeout"):
        RunDir(root=tmp_path, handoff_timeout=0)
    with pytest.raises(ValueError, match="every_n_train_steps"):
        RequeueCheckpoint(every_n_train_steps=0)
    with pytest.raises(ValueError, match="every_n_minutes"):
        RequeueCheckpoint(every_n_minutes=-1)
