"""A shuffled torchdata ``StatefulDataLoader`` under 2-rank DDP (gloo) resumes exactly after kills.

Three things broke it before (see ``lightning_resume/exact_resume/stateful_loaders.py``): Lightning saved
rank 0's loader state for every rank, resumed a ``DistributedSampler`` before ``set_epoch``, and
wrapped torchdata's ``RandomSampler`` so that its permutation was in no saved state. Each test kills
the job three times at steps chosen at random (one resuming at an epoch boundary), relaunches it, and
compares the final weights bitwise with an uninterrupted run.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import JOB_MODULE, job_env, run_job, same_weights

STEPS_PER_EPOCH = 6  # 96 samples, batch 8, 2 ranks
EPOCHS = 3
ARGS = ("--devices", "2", "--loader", "stateful", "--epochs", str(EPOCHS))


def kill_steps(seed: int) -> list[int]:
    """Three steps: two at random, and one that resumes from an epoch boundary.

    With a stateful loader the epoch boundary is saved after the next epoch's first batch (step
    ``6k + 1``); a kill at ``6k + 2`` comes before that step's own save, so the restart resumes there.
    """
    rng = random.Random(seed)
    boundary = STEPS_PER_EPOCH * rng.randrange(1, EPOCHS) + 2
    others = rng.sample([s for s in range(2, STEPS_PER_EPOCH * EPOCHS) if s != boundary], 2)
    return sorted([boundary, *others])


def first_steps(output: str) -> set[int]:
    return {int(step) for step in re.findall(r"FIRST_STEP rank=\d step=(\d+)", output)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted 2-rank run (the number of loader workers does not change the data here)."""
    folder = tmp_path_factory.mktemp("ddp-stateful-ref")
    result = run_job(folder / "runs", folder / "ref.pt", *ARGS, timeout=600)
    assert result.returncode == 0, result.output
    return folder / "ref.pt"


@pytest.mark.parametrize(
    "count", [pytest.param(n, marks=pytest.mark.slow) for n in (1, 3)], ids=["one-kill", "three-kills"]
)
def test_lightning_launcher_with_workers_resumes_exactly_after_kills(
    tmp_path: Path, reference: Path, count: int
) -> None:
    kills = kill_steps(seed=13)[:count]
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    resumed = []
    for attempt, kill in enumerate([*kills, None]):
        extra = ("--kill-at", str(kill)) if kill is not None else ()
        restart = {"SLURM_RESTART_COUNT": attempt} if attempt else {}
        result = run_job(root, out, *ARGS, "--workers", "2", *extra, timeout=600, SLURM_JOB_ID=11, **restart)
        assert result.returncode == (-9 if kill is not None else 0), result.output
        resumed.append(first_steps(result.output))
    assert resumed[0] == {0} and all(len(steps) == 1 and min(steps) > 0 for steps in resumed[1:]), resumed
    assert same_weights(out, reference), f"kills at {kills}"


@pytest.mark.slow
def test_torchrun_restarts_resume_exactly_after_three_kills_of_rank_1(
    tmp_path: Path, reference: Path
) -> None:
    kills = kill_steps(seed=7)
    out = tmp_path / "out.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [
        "--max-restarts",
        "3",
        "-m",
        JOB_MODULE,
        "--root",
        str(tmp_path / "runs"),
        "--out",
        str(out),
        *ARGS,
    ]
    cmd += ["--kill-at", ",".join(map(str, kills)), "--kill-rank", "1"]
    env = job_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert first_steps(output) - {0}, output  # every restart resumed past step 0 ...
    assert len(first_steps(output)) == len(kills) + 1, output  # ... from its own saved step
    assert same_weights(out, reference), f"kills at {kills}"


@pytest.mark.edge
@pytest.mark.heavy
def test_an_epoch_end_resume_under_ddp_with_workers_draws_the_next_epochs_order(tmp_path: Path) -> None:
    """Lightning #21938 (open since 2.5.3): after an epoch-end resume with ``num_workers>0`` the first
    epoch may iterate the DistributedSampler's epoch-0 permutation. Plain loaders with 2 workers and
    augmentation, saved only at epoch ends, killed at step 7 (resumed from the boundary at step 6)."""
    args = ("--devices", "2", "--loader", "plain", "--workers", "2", "--augment", "--every", "0")
    reference = run_job(tmp_path / "ref", tmp_path / "ref.pt", *args, timeout=600)
    assert reference.returncode == 0, reference.output
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    killed = run_job(root, out, *args, "--kill-at", "7", timeout=600, SLURM_JOB_ID=12)
    assert killed.returncode == -9, killed.output
    resumed = run_job(root, out, *args, timeout=600, SLURM_JOB_ID=12, SLURM_RESTART_COUNT=1)
    assert resumed.returncode == 0, resumed.output
    assert first_steps(resumed.output) == {6}, resumed.output
    assert same_weights(out, tmp_path / "ref.pt")
