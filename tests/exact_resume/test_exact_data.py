"""Plain DataLoaders resumed mid-epoch: the same batches, in the same order, and the same weights.

Each case SIGKILLs a real job three times (SLURM restart env) and compares, step by step, the sample
indices every step trained on, and the final weights, with an uninterrupted run.
"""

from __future__ import annotations

import functools
import inspect
import random
from pathlib import Path

import pytest
import torch
from conftest import run_job, same_weights
from torch.utils.data import DataLoader, IterableDataset

from lightning_resume.exact_resume.data_position import loader_problem, positions


def steps_seen(log: Path, rank: int = 0) -> list[str]:
    path = Path(f"{log}.rank{rank}")
    return path.read_text().splitlines() if path.exists() else []


def check_preempted_run(tmp_path: Path, kills: list[int], *args: str, ranks: int = 1) -> None:
    ref_log, log = tmp_path / "ref.log", tmp_path / "run"
    ref = run_job(tmp_path / "ref", tmp_path / "ref.pt", *args, "--sample-log", ref_log)
    assert ref.returncode == 0, ref.output
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    resumed_from = 0
    for attempt, kill in enumerate([*kills, None]):
        attempt_log = Path(f"{log}{attempt}")
        extra = ["--kill-at", str(kill)] if kill is not None else []
        result = run_job(
            root,
            out,
            *args,
            *extra,
            "--sample-log",
            attempt_log,
            SLURM_JOB_ID="808",
            SLURM_RESTART_COUNT=attempt or None,
            timeout=240,
        )
        assert result.returncode == (0 if kill is None else -9), result.output
        for rank in range(ranks):
            seen, expected = steps_seen(attempt_log, rank), steps_seen(ref_log, rank)
            # The attempt trained steps resumed_from+1 .. its kill (or the end): same batches, same order.
            assert seen == expected[resumed_from : resumed_from + len(seen)], (
                f"attempt {attempt}, rank {rank}"
            )
            assert seen, f"attempt {attempt} trained nothing"
        if kill is not None:
            last = next(root.glob("[0-9]*/[0-9]*/*/checkpoints/last.ckpt"))
            resumed_from = torch.load(last, weights_only=False)["global_step"]
    assert resumed_from + len(steps_seen(Path(f"{log}{len(kills)}"))) == len(steps_seen(ref_log))
    assert same_weights(out, tmp_path / "ref.pt"), f"kills at {kills}"


@pytest.mark.parametrize(
    ("args", "seed"),
    [
        pytest.param(("--loader", "plain"), 11, marks=pytest.mark.slow),
        pytest.param(("--loader", "plain", "--drop-last", "--samples", "100"), 12, marks=pytest.mark.slow),
        pytest.param(("--loader", "plain", "--workers", "2", "--augment"), 13, marks=pytest.mark.heavy),
        pytest.param(
            ("--loader", "plain", "--batch-size", "7", "--samples", "90", "--augment"),
            14,
            marks=pytest.mark.slow,
        ),
    ],
    ids=["shuffled", "drop-last", "workers-augment", "ragged-last-batch"],
)
@pytest.mark.edge
def test_plain_loader_resumes_exactly_after_three_kills(
    tmp_path: Path, args: tuple[str, ...], seed: int
) -> None:
    kills = sorted(random.Random(seed).sample(range(3, 34), 3))
    check_preempted_run(tmp_path, kills, *args, "--every", "3")


@pytest.mark.slow
def test_kills_on_the_first_and_last_batch_of_an_epoch(tmp_path: Path) -> None:
    # Steps 13 and 24 are the first and the last batch of epochs 2 and 2 (12 batches per epoch).
    check_preempted_run(tmp_path, [13, 24, 25], "--loader", "plain", "--every", "1")


@pytest.mark.edge
@pytest.mark.heavy
def test_distributed_sampler_on_two_ranks_resumes_exactly(tmp_path: Path) -> None:
    check_preempted_run(tmp_path, [9], "--loader", "plain", "--devices", "2", "--every", "2", ranks=2)


@pytest.mark.slow
def test_distributed_sampler_on_two_ranks_resumes_exactly_after_three_kills(tmp_path: Path) -> None:
    check_preempted_run(tmp_path, [4, 9, 15], "--loader", "plain", "--devices", "2", "--every", "2", ranks=2)


def test_loaders_that_cannot_be_positioned_are_named_and_iterables_are_replayed() -> None:
    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(10))

    assert loader_problem(DataLoader(Stream())) is None  # drawn again from its epoch's start
    assert loader_problem(DataLoader(list(range(10)), shuffle=True)) is None
    # persistent workers of a map-style dataset: their streams are recorded (exact_resume/persistent_workers)
    assert loader_problem(DataLoader(list(range(10)), num_workers=1, persistent_workers=True)) is None
    if "in_order" in inspect.signature(DataLoader).parameters:  # torch >= 2.6
        out_of_order = DataLoader(list(range(10)), num_workers=1, persistent_workers=True, in_order=False)
        assert "in_order=False" in (loader_problem(out_of_order) or "")


def test_several_loaders_are_put_back_inside_their_current_pass() -> None:
    cycle = functools.partial(positions, lengths=[3, 8], mode="max_size_cycle")
    assert [cycle(skip) for skip in (2, 3, 4, 7)] == [[2, 2], [3, 3], [1, 4], [1, 7]]  # 3: exhausted
    assert positions(5, [3, 8], "max_size") == [3, 5]
    assert positions(5, [None, 8], "max_size_cycle") == [5, 5]  # an IterableDataset: no length
