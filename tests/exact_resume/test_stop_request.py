"""A stop asked for before ``min_steps`` is met outlives a restart.

A callback asks the Trainer to stop after step 8 (as ``EarlyStopping`` does once its metric stalls);
with ``min_steps=30`` Lightning trains on to step 30 and stops there, short of ``max_steps=36``. The
request is in no Lightning checkpoint: a job SIGKILLed in between and resumed must still stop at 30,
with the uninterrupted run's weights, not train on to 36.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import run_job, same_weights, uninterrupted

# 12 batches an epoch, a save every 5 steps and at each epoch's end (step 12).
STOPS_EARLY = (
    "--loader", "plain", "--every", "5", "--max-steps", "36", "--min-steps", "30", "--stop-at", "8",
)  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return uninterrupted(tmp_path_factory, "stop-request", *STOPS_EARLY, timeout=300)


def final_step(out: Path) -> int:
    return int(json.loads(Path(f"{out}.json").read_text())["step"])


def test_the_uninterrupted_run_stops_at_min_steps(reference: Path) -> None:
    assert final_step(reference) == 30  # the request was deferred, then honoured


@pytest.mark.parametrize(
    ("kill", "resumed_at"),
    [(11, 10), pytest.param(14, 12, marks=pytest.mark.slow)],
    ids=["mid-epoch", "epoch-boundary"],
)
def test_a_restart_keeps_the_stop_asked_for_before_its_checkpoint(
    tmp_path: Path, reference: Path, kill: int, resumed_at: int
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(root, out, *STOPS_EARLY, "--kill-at", kill, SLURM_JOB_ID="31", timeout=300)
    assert first.returncode == -9, first.output
    again = run_job(root, out, *STOPS_EARLY, SLURM_JOB_ID="31", SLURM_RESTART_COUNT=1, timeout=300)
    assert again.returncode == 0, again.output
    assert re.findall(r"FIRST_STEP rank=0 step=(\d+)", again.output) == [str(resumed_at)], again.output
    assert "a stop asked for before step" in again.output
    assert final_step(out) == 30, again.output
    assert same_weights(out, reference)


@pytest.mark.slow
def test_a_new_run_started_from_the_checkpoint_decides_afresh(tmp_path: Path) -> None:
    """``ckpt_path`` into a new run (say, to train on past the stop): the old request is not applied."""
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(root, out, *STOPS_EARLY, "--kill-at", 11, SLURM_JOB_ID="31", timeout=300)
    assert first.returncode == -9, first.output
    (last,) = root.rglob("checkpoints/last.ckpt")
    start = shutil.copy(last, tmp_path / "start.ckpt")
    no_stop = [a for a in STOPS_EARLY if a not in ("--stop-at", "8")]
    again = run_job(tmp_path / "new", out, *no_stop, "--ckpt-path", start, SLURM_JOB_ID="32", timeout=300)
    assert again.returncode == 0, again.output
    assert re.findall(r"FIRST_STEP rank=0 step=(\d+)", again.output) == ["10"], again.output
    assert final_step(out) == 36, again.output
