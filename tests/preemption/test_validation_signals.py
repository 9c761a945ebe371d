"""A preemption signal outside the training batch loop: during validation, the sanity check, a slow
``on_train_epoch_end``, and to a process group with DataLoader workers.

Validation of 200 batches at 0.05 s each (10 s) is longer than a scheduler's grace time should have
to be. The job must stop within one validation batch, exit 143 with ``last.ckpt`` at the last
training step, and the restart must run that validation again and end bitwise equal.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_job, same_weights

PREEMPTED = 143
# 96 samples, batch 8: 12 steps per epoch; validation after step 6 and at the epoch end (step 12).
SLOW_VALIDATION = (
    "--loader",
    "plain",
    "--epochs",
    "1",
    "--every",
    "4",
    "--preemption",
    "--val-samples",
    "200",
    "--val-batch-size",
    "1",
    "--val-sleep",
    "0.05",
    "--val-check-interval",
    "6",
    "--sanity",
    "0",
)


def validations(output: str) -> list[tuple[int, int]]:
    """``(step, batches)`` of every fit validation an attempt finished."""
    found = re.findall(r"VAL_DONE sanity=False step=(\d+) batches=(\d+)", output)
    return [(int(step), int(batches)) for step, batches in found]


@pytest.fixture(scope="module")
def slow_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[int, int]]]:
    folder = tmp_path_factory.mktemp("slow-validation-ref")
    result = run_job(folder / "runs", folder / "ref.pt", *SLOW_VALIDATION, timeout=600)
    assert result.returncode == 0, result.output
    return folder / "ref.pt", validations(result.output)


@pytest.mark.parametrize(
    ("after_step", "where"),
    [
        pytest.param(0, "mid-epoch", marks=pytest.mark.long),
        pytest.param(7, "epoch end", marks=pytest.mark.slow),
    ],
)
def test_sigterm_during_validation_stops_within_one_batch_and_the_restart_redoes_it(
    tmp_path: Path, slow_reference: tuple[Path, list[tuple[int, int]]], after_step: int, where: str
) -> None:
    reference, reference_validations = slow_reference
    assert reference_validations == [(6, 200), (12, 200)]
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    signal = ("--signal-in", "val", "--signal-step", str(after_step), "--signal-k", "50")
    first = run_job(root, out, *SLOW_VALIDATION, *signal, LIGHTNING_RESUME_KEY="val")
    assert first.returncode == PREEMPTED, first.output
    after = [int(n) for n in re.findall(r"VAL_BATCH_AFTER_SIGNAL (\d+)", first.output)]
    assert max(after) <= 1, f"{where}: validation went on for {max(after)} batches after the signal"
    saved = 6 if where == "mid-epoch" else 12
    assert f"Preempted by SIGTERM at step {saved}" in first.output, first.output
    again = run_job(root, out, *SLOW_VALIDATION, LIGHTNING_RESUME_KEY="val", timeout=600)
    assert again.returncode == 0, again.output
    assert validations(again.output)[0] == (saved, 200), again.output  # the interrupted one, in full
    assert same_weights(out, reference)


def test_sigterm_during_the_sanity_check_stops_at_once_and_the_restart_is_exact(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    args = ("--loader", "plain", "--preemption")
    first = run_job(root, out, *args, "--signal-in", "sanity", "--signal-k", "1", LIGHTNING_RESUME_KEY="s")
    assert first.returncode == PREEMPTED, first.output
    assert "FIRST_STEP" not in first.output  # stopped before any training step
    again = run_job(root, out, *args, LIGHTNING_RESUME_KEY="s")
    assert again.returncode == 0, again.output
    assert same_weights(out, baseline["plain"])


@pytest.mark.slow
def test_ddp_sigterm_to_one_rank_during_the_sanity_check_stops_every_rank(tmp_path: Path) -> None:
    args = ("--devices", "2", "--loader", "plain", "--preemption", "--epochs", "1")
    signal = ("--signal-in", "sanity", "--signal-k", "0", "--signal-rank", "1")
    first = run_job(tmp_path / "runs", tmp_path / "out.pt", *args, *signal, timeout=300)
    assert first.returncode == PREEMPTED, first.output  # Lightning's own handling hangs here


@pytest.mark.slow
def test_a_long_user_epoch_end_is_acted_on_at_the_next_hook_after_it(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    args = ("--loader", "plain", "--preemption")
    signal = ("--signal-in", "epoch_end", "--signal-step", "12", "--epoch-end-sleep", "2")
    first = run_job(root, out, *args, *signal, LIGHTNING_RESUME_KEY="e")
    assert first.returncode == PREEMPTED, first.output
    assert "Preempted by SIGTERM at step 12" in first.output, first.output  # at the epoch boundary
    again = run_job(root, out, *args, LIGHTNING_RESUME_KEY="e")
    assert again.returncode == 0, again.output
    assert same_weights(out, baseline["plain"])


@pytest.mark.parametrize("loader", ["plain", pytest.param("stateful", marks=pytest.mark.slow)])
def test_sigterm_to_the_process_group_with_dataloader_workers_stops_cleanly(
    tmp_path: Path, loader: str
) -> None:
    args = ("--loader", loader, "--workers", "2", "--preemption")
    reference = run_job(tmp_path / "ref", tmp_path / "ref.pt", *args)  # workers change the random draws
    assert reference.returncode == 0, reference.output
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    # From another process to the whole group, as SLURM and `kill -- -PGID` send it.
    first = run_job(root, out, *args, "--signal-at", "7", "--signal-group", LIGHTNING_RESUME_KEY="g")
    assert first.returncode == PREEMPTED, first.output
    assert "killed by signal" not in first.output and "exited unexpectedly" not in first.output
    assert "Preempted by SIGTERM at step" in first.output
    again = run_job(root, out, *args, LIGHTNING_RESUME_KEY="g")
    assert again.returncode == 0, again.output
    assert same_weights(out, tmp_path / "ref.pt")


@pytest.mark.parametrize("loader", [pytest.param(n, marks=pytest.mark.slow) for n in ("plain", "stateful")])
def test_a_kill_after_a_save_that_a_validation_followed_resumes_exactly(tmp_path: Path, loader: str) -> None:
    # last.ckpt is saved at step 6; the validation after step 6 draws random numbers; the kill at 7
    # comes after it. The restart redoes that validation (Lightning alone would skip it).
    args = ("--loader", loader, "--epochs", "1", "--every", "2", "--val-check-interval", "6", "--sanity", "0")
    reference = run_job(tmp_path / "ref", tmp_path / "ref.pt", *args)
    assert reference.returncode == 0, reference.output
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(root, out, *args, "--kill-at", "7", LIGHTNING_RESUME_KEY="v")
    assert first.returncode == -9, first.output
    again = run_job(root, out, *args, LIGHTNING_RESUME_KEY="v")
    assert again.returncode == 0, again.output
    assert validations(again.output)[0][0] == 6, again.output
    assert same_weights(out, tmp_path / "ref.pt")
