"""The user's ModelCheckpoint beside RequeueCheckpoint: never on our last.ckpt, "best"/"last" as
without us, no misleading warnings on a restart; our INFO lines shown where Lightning's are."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import job_env
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import RequeueCheckpoint, RunDir
from lightning_resume.last_ckpt.users_checkpoints import USERS_LAST


def trainer(tmp_path: Path, *callbacks: pl.Callback, steps: int = 6) -> pl.Trainer:
    return pl.Trainer(
        max_steps=steps,
        limit_val_batches=2,
        val_check_interval=3,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[RunDir(root=tmp_path / "runs", key="k"), *callbacks],
    )


class Logged(BoringModel):
    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().validation_step(batch, batch_idx)
        self.log("valid_loss", out["x"])
        return out


def weights(path: str | Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=False)["state_dict"]


@pytest.mark.parametrize("users_first", [True, False])
def test_a_users_save_last_never_writes_our_last_ckpt(tmp_path: Path, users_first: bool) -> None:
    ours, theirs = RequeueCheckpoint(every_n_train_steps=4), ModelCheckpoint(save_last=True)
    t = trainer(tmp_path, *((theirs, ours) if users_first else (ours, theirs)), steps=5)
    t.fit(BoringModel())
    folder = Path(ours.checkpoint_dir)
    assert theirs.CHECKPOINT_NAME_LAST == USERS_LAST
    assert theirs.last_model_path == str(folder / f"{USERS_LAST}.ckpt")
    # Ours saved at step 4 and at the end (5); theirs at each validation end (3) and the end.
    assert torch.load(folder / "last.ckpt", weights_only=False)["callbacks"]["ExactResume"]
    assert {p.name for p in folder.glob("last*.ckpt")} == {"last.ckpt", f"{USERS_LAST}.ckpt"}
    assert not list(folder.glob("last-v*.ckpt"))  # Lightning's name for a taken "last.ckpt"


@pytest.mark.parametrize("users", ["none", "monitored, listed after ours"])
def test_best_and_last_work_as_without_us(tmp_path: Path, users: str) -> None:
    model = Logged()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # first: our filters go before it
        ours = RequeueCheckpoint(every_n_train_steps=2)
        theirs = ModelCheckpoint(monitor="valid_loss", save_last=True) if users != "none" else None
        t = trainer(tmp_path, ours, *([theirs] if theirs else []))
        t.fit(model)
        assert t.checkpoint_callback is (theirs or ours)
        t.test(model, ckpt_path="best")
        best = t.ckpt_path
        t.test(model, ckpt_path="last")
    assert best == (theirs.best_model_path if theirs else ours.ckpt_path)
    assert Path(best).exists() and weights(best)
    newest = [ours.ckpt_path, *([theirs.last_model_path] if theirs else [])]
    assert t.ckpt_path == max(newest, key=lambda p: Path(p).stat().st_mtime)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "multiple `ModelCheckpoint`" in m or "following callbacks" in m]


def test_a_restart_does_not_warn_about_the_run_dirs_own_checkpoints(tmp_path: Path) -> None:
    trainer(tmp_path, RequeueCheckpoint(every_n_train_steps=2), ModelCheckpoint(save_last=True)).fit(
        BoringModel()
    )
    again = trainer(
        tmp_path, RequeueCheckpoint(every_n_train_steps=2), ModelCheckpoint(save_last=True), steps=9
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again.fit(BoringModel())
    assert again.global_step == 9 and again.ckpt_path  # resumed
    assert not [w for w in caught if "exists and is not empty" in str(w.message)]


SCRIPT = """
import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning_resume import RequeueCheckpoint, RunDir
trainer = pl.Trainer(max_steps=2, logger=False, enable_progress_bar=False, limit_val_batches=0,
    callbacks=[RunDir(root={root!r}), RequeueCheckpoint()])
trainer.fit(BoringModel())
"""


@pytest.mark.parametrize("configured", [False, True])
def test_our_info_lines_show_where_lightnings_do(tmp_path: Path, configured: bool) -> None:
    """Nothing configured (a LightningCLI script): ours print like Lightning's; configured: once."""
    code = ("import logging; logging.basicConfig(level=logging.INFO)\n" if configured else "") + SCRIPT
    done = subprocess.run(
        [sys.executable, "-c", code.format(root=str(tmp_path / "runs"))],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "(fresh run" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("INFO:lightning_resume.run_dir" if configured else "RunDir ")


def test_our_lines_reach_pytest_and_users_handlers(caplog: Any, tmp_path: Path) -> None:
    caplog.set_level(logging.INFO)
    trainer(tmp_path, RequeueCheckpoint()).fit(BoringModel())
    assert any("(fresh run" in r.getMessage() for r in caplog.records)
