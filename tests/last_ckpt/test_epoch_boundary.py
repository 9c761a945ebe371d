"""Epoch boundaries and what is logged, after real kills (issue 21 items 1-3).

A real job (``tests/jobs/train_job.py``) with ``EarlyStopping`` and ``ModelCheckpoint`` on
``val_loss``, a ``ReduceLROnPlateau`` scheduler, torchmetrics objects and ``self.log(on_epoch=True)``
values, logged through a ``CSVLogger``, is SIGKILLed and relaunched; its final weights, its
``metrics.csv`` and what the monitoring callbacks decided must equal an uninterrupted run's. And a
fresh run with our callbacks must draw what the same script draws without them.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from conftest import built_once, run_job, same_weights

# 12 batches per epoch: steps 1-12 are epoch 0, 13-24 epoch 1, 25-36 epoch 2. Step-based (as large
# models train): Lightning 2.6 alone wedges on an epoch-end checkpoint with EarlyStopping there.
MONITORED = (
    "--loader", "plain", "--monitor", "--patience", "3", "--metrics", "--plateau", "--csv", "--every", "5",
    "--max-steps", "36",
)  # fmt: skip
# The same by epochs.
BY_EPOCHS = (*MONITORED[:-2], "--epochs", "3")


def reference_run(folder: Path, *args: str) -> None:
    """An uninterrupted run of ``args`` in ``folder``: its weights, callbacks' decisions and CSV logs."""
    attempt = run_job(folder / "runs", folder / "ref.pt", *args, timeout=300)
    assert attempt.returncode == 0, attempt.output
    assert attempt.run_dir is not None
    (folder / "metrics.csv").write_bytes(metrics_csv(attempt.run_dir).read_bytes())


@pytest.fixture(scope="module")
def monitored_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "epoch-monitored", lambda folder: reference_run(folder, *MONITORED))


def metrics_csv(run_dir: Path) -> Path:
    (found,) = (run_dir / "csv").glob("version_*/metrics.csv")
    return found


def logged(path: Path) -> set[tuple[str, str, str]]:
    """Every value a ``metrics.csv`` holds, as (step, key, value); the column order may differ."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        (row["step"], key, value) for row in rows for key, value in row.items() if key != "step" and value
    }


def first_steps(output: str) -> list[int]:
    return [int(step) for step in re.findall(r"FIRST_STEP rank=0 step=(\d+)", output)]


def kill_and_resume(tmp_path: Path, reference: Path, kill: int, resumed_at: int, *args: str) -> None:
    """SIGKILL ``args``'s job at step ``kill``, relaunch it: it must resume at ``resumed_at`` (not start
    over) and end as the reference did: weights, logged values, the monitoring callbacks' decisions."""
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(root, out, *args, "--kill-at", kill, SLURM_JOB_ID="21", timeout=300)
    assert first.returncode == -9, first.output
    again = run_job(root, out, *args, SLURM_JOB_ID="21", SLURM_RESTART_COUNT=1, timeout=300)
    assert again.returncode == 0, again.output
    assert first_steps(again.output) == [resumed_at], again.output
    assert again.run_dir is not None
    assert same_weights(out, reference / "ref.pt"), f"kill at {kill}"
    expected, got = logged(reference / "metrics.csv"), logged(metrics_csv(again.run_dir))
    assert got == expected, (
        f"kill at {kill}: missing {sorted(expected - got)[:6]}, extra {sorted(got - expected)[:6]}"
    )
    decided = json.loads(Path(f"{out}.callbacks.json").read_text())
    assert decided == json.loads((reference / "ref.pt.callbacks.json").read_text())


# Where the last checkpoint before each kill was taken: every 5 steps, and at the epoch boundary
# (step 12, saved once epoch 0's end has run in full, as epoch 1 starts).
BOUNDARY_WINDOW = [(11, 10), (12, 10), (13, 12), (14, 12), (15, 12), (16, 15)]


@pytest.mark.parametrize(
    ("kill", "resumed_at"),
    [
        pytest.param(*k, marks=pytest.mark.edge if k == (13, 12) else pytest.mark.slow)
        for k in BOUNDARY_WINDOW
    ],
    ids=[f"kill-{k}" for k, _ in BOUNDARY_WINDOW],
)
def test_kill_after_an_epoch_end_resumes_with_equal_weights_logs_and_decisions(
    tmp_path: Path, monitored_reference: Path, kill: int, resumed_at: int
) -> None:
    kill_and_resume(tmp_path, monitored_reference, kill, resumed_at, *MONITORED)


@pytest.mark.parametrize(
    ("kill", "resumed_at"),
    [(18, 15), pytest.param(33, 30, marks=pytest.mark.slow)],
    ids=["epoch-1", "epoch-2"],
)
def test_epoch_metrics_logged_after_a_mid_epoch_kill_equal_the_uninterrupted_ones(
    tmp_path: Path, monitored_reference: Path, kill: int, resumed_at: int
) -> None:
    # The resumed epoch's train/mse (torchmetrics), train/loss_epoch (a logged mean) and
    # train/index_sum (a logged sum) cover batches from before and after the kill.
    kill_and_resume(tmp_path, monitored_reference, kill, resumed_at, *MONITORED)


DRAWS = ("--loader", "plain", "--augment", "--epochs", "2", "--every", "3")


def draw_logs(tmp_path: Path, *args: str) -> tuple[list[str], list[str], Path]:
    """One fresh run: the sample indices and the augmentation/model draws of every step, its weights."""
    samples, draws, out = tmp_path / "samples", tmp_path / "draws", tmp_path / "out.pt"
    attempt = run_job(tmp_path / "runs", out, *args, "--sample-log", samples, "--draw-log", draws)
    assert attempt.returncode == 0, attempt.output
    read = [Path(f"{log}.rank0").read_text().splitlines() for log in (samples, draws)]
    return read[0], read[1], out


@pytest.mark.parametrize(
    "args",
    [
        ("--workers", "2"),
        pytest.param(("--workers", "0"), marks=pytest.mark.slow),
        pytest.param(("--workers", "2", "--no-seed-workers"), marks=pytest.mark.slow),
        pytest.param(("--workers", "0", "--no-seed-workers"), marks=pytest.mark.slow),
    ],
    ids=["workers-2", "workers-0", "workers-2-unseeded", "workers-0-unseeded"],
)
def test_a_fresh_run_draws_what_it_draws_without_our_callbacks(tmp_path: Path, args: tuple[str, ...]) -> None:
    plain = draw_logs(tmp_path / "plain", *DRAWS, *args, "--no-requeue")
    ours = draw_logs(tmp_path / "ours", *DRAWS, *args)
    assert ours[0] == plain[0], "the batches differ"
    assert ours[1] == plain[1], "the augmentations or the model's draws differ"
    assert same_weights(ours[2], plain[2])


@pytest.mark.slow
@pytest.mark.parametrize(("kill", "resumed_at"), [(13, 12), (18, 15)])
def test_kills_around_an_epoch_end_by_epochs(tmp_path: Path, kill: int, resumed_at: int) -> None:
    reference_run(tmp_path / "reference", *BY_EPOCHS)
    kill_and_resume(tmp_path, tmp_path / "reference", kill, resumed_at, *BY_EPOCHS)


@pytest.mark.slow
def test_epoch_metrics_of_each_rank_after_a_kill_under_ddp(tmp_path: Path) -> None:
    # Two ranks, 6 batches each per epoch: the kill at step 11 resumes epoch 1 at step 10. val_loss is
    # logged without sync_dist, so each rank's ReduceLROnPlateau and EarlyStopping follow its own
    # value: at epoch 1's end rank 1 lowers its learning rate only if it resumed with its own
    # scheduler state, not rank 0's (the unit tests: tests/exact_resume/test_per_rank_states.py).
    args = (*BY_EPOCHS, "--devices", "2")
    reference_run(tmp_path / "reference", *args)
    kill_and_resume(tmp_path, tmp_path / "reference", 11, 10, *args)
