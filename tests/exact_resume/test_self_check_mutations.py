"""The self-check's net, proven: each kind of divergence, put into a real killed-and-resumed run's restored
state on purpose, is named by the self-check's one warning (docs: exact_resume.md, "What the self-check
catches").

Each case's killed attempt runs once (``tests/jobs/matrix_job.py``, SIGKILLed at step 10 with
``last.ckpt`` of step 8 and the record of the step after it whole, or SIGTERMed inside an accumulation
window); each kind then relaunches a copy of it with ``--mutate KIND`` (:class:`jobs.matrix_job.Mutate`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import built_once
from exact_resume.test_matrix import SELF_CHECK, run_matrix
from exact_resume.test_self_check import verdicts


class Kill(NamedTuple):
    case: str
    at: int
    place: str = "step"


STEP10 = Kill("plain", 10)
#: Each kind: the killed attempt it resumes, the field the warning must name, and whether it runs in
#: ``make test`` (the others are ``slow``).
KINDS = {
    "batch": (STEP10, "batch", False),
    "sampler_epoch": (Kill("dist_sampler", 10), "batch", False),
    "frozen": (STEP10, "trainable", False),
    "bn_flag": (Kill("batch_norm", 10), "modes", False),
    "eval": (STEP10, "modes", False),
    "scheduler": (STEP10, "optimizers", False),
    "adam_moments": (STEP10, "outcome", True),
    "param_group": (Kill("finetuning", 10), "optimizers", False),
    "python_rng": (STEP10, "rng", False),
    "numpy_rng": (STEP10, "rng", False),
    "torch_rng": (STEP10, "rng", False),
    # SIGTERM at the run's batch 13: the second batch of step 4's accumulation window (3 batches a step)
    "grads": (Kill("accumulate_steps", 13, "sigterm_batch"), "grads", False),
    "loop_counters": (STEP10, "position", True),
}


def _killed(tmp_path_factory: pytest.TempPathFactory, kill: Kill) -> Path:
    """The run root a kill left (built once per test run)."""

    def build(folder: Path) -> None:
        where = ("--kill-at", kill.at, "--kill-in", kill.place)
        killed = run_matrix(folder / "runs", folder / "out.pt", kill.case, *where, SLURM_JOB_ID="77")
        assert killed.returncode in (-9, 143), killed.output[-4000:]

    return built_once(tmp_path_factory, f"mutations-{kill.case}-{kill.place}{kill.at}", build)


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        pytest.param(kind, named, id=kind, marks=[] if fast else [pytest.mark.slow])
        for kind, (_, named, fast) in KINDS.items()
    ],
)
def test_the_self_check_names_each_kind_of_divergence(
    kind: str, named: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    kill = KINDS[kind][0]
    killed = _killed(tmp_path_factory, kill)
    shutil.copytree(killed / "runs", tmp_path / "runs")
    restart = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": 1}
    relaunch = run_matrix(tmp_path / "runs", tmp_path / "out.pt", kill.case, "--mutate", kind, **restart)
    assert relaunch.returncode == 0, relaunch.output[-4000:]
    warnings = [line for line in relaunch.output.splitlines() if SELF_CHECK in line]
    assert len(warnings) == 1, relaunch.output[-4000:]
    verdict = verdicts(tmp_path / "runs")[-1]  # "differs: field, field"
    assert verdict is not None and named in verdict.removeprefix("differs: ").split(", "), warnings[0]
