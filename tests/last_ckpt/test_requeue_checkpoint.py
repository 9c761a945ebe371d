"""End to end: a real job is SIGKILLed at random steps and relaunched the way a scheduler would."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from conftest import run_job, same_weights, tiny_trainer, uninterrupted
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import RequeueCheckpoint, RunDir

TOTAL_STEPS = 36  # 96 samples, batch 8, 3 epochs


def kill_steps(seed: int, count: int = 3) -> list[int]:
    return sorted(random.Random(seed).sample(range(2, TOTAL_STEPS), count))


def preempt_and_resume(tmp_path: Path, kills: list[int], env_for_attempt, *extra: str) -> Path:  # type: ignore[no-untyped-def]
    """Run attempt 0..len(kills); each but the last is killed at its step; return the final run dir."""
    root, out = tmp_path / "runs", tmp_path / "final.pt"
    for attempt, step in enumerate([*kills, None]):
        args = [*extra] + (["--kill-at", str(step)] if step is not None else [])
        result = run_job(root, out, *args, **env_for_attempt(attempt))
        if step is not None:
            assert result.returncode == -9, result.output
        else:
            assert result.returncode == 0, result.output
            assert result.run_dir is not None
            assert [p for p in root.glob("[0-9]*/[0-9]*/*")] == [result.run_dir], "expected one run dir"
            return result.run_dir
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    "seed",
    [pytest.param(0, marks=[pytest.mark.edge, pytest.mark.heavy]), pytest.param(1, marks=pytest.mark.slow)],
)
def test_slurm_requeue_three_kills_is_bitwise_exact(
    tmp_path: Path, baseline: dict[str, Path], seed: int
) -> None:
    kills = kill_steps(seed)
    preempt_and_resume(tmp_path, kills, lambda n: {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": n or None})
    assert same_weights(tmp_path / "final.pt", baseline["stateful"]), f"kills at {kills}"


@pytest.mark.edge
@pytest.mark.heavy
def test_gradient_accumulation_resumes_exactly_after_kills(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # 6 optimizer steps an epoch; saves every 2; kills inside and between accumulation windows.
    args = ("--loader", "plain", "--accumulate", "2", "--every", "2")
    reference = uninterrupted(tmp_path_factory, "accumulate-2", *args)
    slurm = lambda n: {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": n or None}  # noqa: E731
    preempt_and_resume(tmp_path, [4, 9, 13], slurm, *args)
    assert same_weights(tmp_path / "final.pt", reference)


@pytest.mark.slow
def test_torchelastic_restart_is_bitwise_exact(tmp_path: Path, baseline: dict[str, Path]) -> None:
    kills = kill_steps(2)
    preempt_and_resume(
        tmp_path, kills, lambda n: {"TORCHELASTIC_RUN_ID": "elastic-1", "TORCHELASTIC_RESTART_COUNT": n}
    )
    assert same_weights(tmp_path / "final.pt", baseline["stateful"]), f"kills at {kills}"


@pytest.mark.slow
def test_explicit_key_resume_is_bitwise_exact(tmp_path: Path, baseline: dict[str, Path]) -> None:
    kills = kill_steps(3)
    preempt_and_resume(tmp_path, kills, lambda n: {"LIGHTNING_RESUME_KEY": "k8s-job-7"})
    assert same_weights(tmp_path / "final.pt", baseline["stateful"]), f"kills at {kills}"


@pytest.mark.slow
def test_epoch_end_saves_make_a_plain_dataloader_exact(tmp_path: Path, baseline: dict[str, Path]) -> None:
    kills = [14, 30]  # mid-epoch kills; only epoch-end checkpoints exist
    preempt_and_resume(
        tmp_path,
        kills,
        lambda n: {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": n or None},
        "--loader",
        "plain",
        "--every",
        "0",
    )
    assert same_weights(tmp_path / "final.pt", baseline["plain"])


def test_without_requeue_checkpoint_the_restart_is_not_exact(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    """The control: the same kill and relaunch with RunDir alone restarts from scratch."""
    root, out = tmp_path / "runs", tmp_path / "final.pt"
    assert run_job(root, out, "--no-requeue", "--kill-at", "20", SLURM_JOB_ID="5").returncode == -9
    assert (
        run_job(
            root, out, "--no-requeue", "--epochs", "1", SLURM_JOB_ID="5", SLURM_RESTART_COUNT=1
        ).returncode
        == 0
    )
    assert not same_weights(out, baseline["stateful"])


@pytest.mark.slow
def test_interactive_rerun_in_one_allocation_gets_a_new_dir(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    first = run_job(root, tmp_path / "a.pt", "--epochs", "1", SLURM_JOB_ID="31")
    second = run_job(root, tmp_path / "b.pt", "--epochs", "1", SLURM_JOB_ID="31")
    assert first.returncode == second.returncode == 0
    assert first.run_dir != second.run_dir
    assert "Restoring states" not in second.output


def test_restart_without_last_ckpt_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    first = run_job(root, tmp_path / "a.pt", "--epochs", "1", SLURM_JOB_ID="32")
    assert first.run_dir is not None
    (first.run_dir / "checkpoints" / "last.ckpt").unlink()
    again = run_job(root, tmp_path / "a.pt", "--epochs", "2", SLURM_JOB_ID="32", SLURM_RESTART_COUNT=1)
    assert again.returncode != 0
    assert "does not exist although the run has saved checkpoints" in again.output


def test_restart_of_a_run_stopped_before_its_first_save_starts_over_exactly(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    # Saves every 2 steps: a kill at step 1 leaves a run dir without any checkpoint.
    root, out = tmp_path / "runs", tmp_path / "a.pt"
    first = run_job(root, out, "--kill-at", "1", SLURM_JOB_ID="34")
    [run_dir] = root.glob("[0-9]*/[0-9]*/*")
    assert first.returncode == -9 and not (run_dir / "checkpoints" / "last.ckpt").exists()
    again = run_job(root, out, SLURM_JOB_ID="34", SLURM_RESTART_COUNT=1)
    assert again.returncode == 0, again.output[-3000:]
    assert again.run_dir == run_dir
    assert "stopped before its first checkpoint: starting from the beginning" in again.output
    assert same_weights(out, baseline["stateful"])


@pytest.mark.slow
def test_restart_ignores_a_fine_tune_ckpt_path_with_one_warning(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    pretrain = run_job(tmp_path / "pre", tmp_path / "pre.pt", "--epochs", "1")
    assert pretrain.run_dir is not None
    start = pretrain.run_dir / "checkpoints" / "last.ckpt"
    root, out = tmp_path / "runs", tmp_path / "final.pt"
    first = run_job(root, out, "--ckpt-path", start, "--epochs", "3", "--kill-at", "20", SLURM_JOB_ID="33")
    assert first.returncode == -9
    assert "FIRST_STEP rank=0 step=12" in first.output  # the first attempt starts from ckpt_path
    again = run_job(
        root, out, "--ckpt-path", start, "--epochs", "3", SLURM_JOB_ID="33", SLURM_RESTART_COUNT=1
    )
    assert again.returncode == 0, again.output
    assert again.output.count("a ckpt_path given to fit() only applies to the first attempt") == 1
    # Reference: the same fine-tune, uninterrupted.
    ref = run_job(tmp_path / "ref", tmp_path / "ref.pt", "--ckpt-path", start, "--epochs", "3")
    assert ref.returncode == 0
    assert same_weights(out, tmp_path / "ref.pt")
    # Continuing a finished 1-epoch run to 3 epochs is exact: the same as 3 epochs in one go.
    assert same_weights(out, baseline["stateful"])


@pytest.mark.slow
def test_lightning_hpc_checkpoint_does_not_override_a_newer_last_ckpt(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    root, out = tmp_path / "runs", tmp_path / "final.pt"
    slurm = {
        "SLURM_JOB_ID": "34",
        "SLURM_NTASKS": 1,
        "SLURM_PROCID": 0,
        "SLURM_LOCALID": 0,
        "SLURM_NODEID": 0,
        "SLURM_JOB_NAME": "train",
        "SLURM_NODELIST": "localhost",
    }
    first = run_job(root, out, "--kill-at", "8", **slurm)
    assert first.returncode == -9, first.output
    run_dir = next(root.glob("[0-9]*/[0-9]*/*"))
    # An older checkpoint saved the way SLURMEnvironment(auto_requeue=True) does, in default_root_dir.
    old = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    old["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["completed"] = 0
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", root / "hpc_ckpt_1.ckpt")
    second = run_job(root, out, "--kill-at", "22", **slurm, SLURM_RESTART_COUNT=1)
    assert second.returncode == -9, second.output
    third = run_job(root, out, **slurm, SLURM_RESTART_COUNT=2)
    assert third.returncode == 0, third.output
    assert "instead of" in third.output and "hpc_ckpt_1.ckpt" in third.output
    assert same_weights(out, baseline["stateful"])


def test_its_private_callbacks_sit_first_and_just_before_the_checkpoints(tmp_path: Path) -> None:
    """During ``fit``: ``EpochBoundary`` first of all, ``ExactResume`` just before the first checkpoint
    callback (so before every ``ModelCheckpoint`` and ``RequeueCheckpoint`` itself)."""
    seen: list[str] = []

    class Look(Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            seen.extend(type(c).__name__ for c in trainer.callbacks)  # type: ignore[attr-defined]

    checkpoints = (ModelCheckpoint(dirpath=tmp_path / "best"), RequeueCheckpoint())
    tiny_trainer(RunDir(root=tmp_path / "runs"), *checkpoints, Look(), tmp_path=tmp_path).fit(BoringModel())
    assert seen[0] == "EpochBoundary"
    first = min(seen.index("ModelCheckpoint"), seen.index("RequeueCheckpoint"))
    assert seen[first - 1] == "ExactResume" and seen.count("ExactResume") == 1, seen
