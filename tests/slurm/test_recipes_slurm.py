"""The SLURM recipes of the docs (``docs/src/recipes/sbatch.sh``, ``submitit_launch.py``) on the real local
SLURM cluster: submitted as a user would, signalled the way the time-limit warning does, requeued once,
resumed in the same run dir, and ``COMPLETED``.

Both jobs are submitted first and then run side by side (one CPU each), so that the two requeue delays
overlap; each test checks one recipe.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import job_env

from .conftest import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.long]

RECIPES = Path(__file__).resolve().parents[2] / "docs" / "src" / "recipes"
BIN = Path(sys.executable).parent
# Slow enough to be signalled while training, short enough to finish soon after the requeue.
TRAIN_ARGS = ("--max-steps", "40", "--every", "4", "--step-sleep", "0.1")


@dataclass
class Submitted:
    """One recipe's job: where it runs, what it logs, and the signal that interrupts it."""

    name: str
    job_id: str
    work: Path
    signal: str
    logs: list[Path]
    signalled: bool = False

    @property
    def output(self) -> str:
        return "".join(p.read_text() for p in self.logs if p.exists())

    def has_checkpoint(self) -> bool:
        return any((self.work / "runs").glob("[0-9]*/[0-9]*/*/checkpoints/last.ckpt"))


def launch(cmd: list[str], work: Path, env: dict[str, str]) -> str:
    """Run a submission command in the recipe folder, as the recipe page says; return its stdout."""
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}): {proc.stdout}{proc.stderr}"
    return proc.stdout


def submit_sbatch(cluster: SlurmCluster, work: Path, env: dict[str, str]) -> Submitted:
    # As in the recipe page: `sbatch sbatch.sh [train.py arguments]` from the folder with train.py.
    out = launch(["sbatch", "--parsable", "sbatch.sh", *TRAIN_ARGS], work, env)
    job_id = out.strip().split(";")[0]
    cluster.submitted.append(job_id)
    # `--output=%x-%j.log` in the script: the job name is "train".
    return Submitted("sbatch", job_id, work, "USR1", [work / f"train-{job_id}.log"])


def submit_submitit(cluster: SlurmCluster, work: Path, env: dict[str, str]) -> Submitted:
    out = launch([sys.executable, "submitit_launch.py", *TRAIN_ARGS], work, env)
    match = re.search(r"submitted job (\d+)", out)
    assert match, out
    job_id = match.group(1)
    cluster.submitted.append(job_id)
    folder = work / "submitit" / job_id
    return Submitted(
        "submitit", job_id, work, "USR2", [folder / f"{job_id}_0_log.out", folder / f"{job_id}_0_log.err"]
    )


@pytest.fixture(scope="module")
def recipes(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Submitted]]:
    """Both SLURM recipes submitted, each signalled once it has a checkpoint, and both finished."""
    cluster = SlurmCluster(slurm_cluster._env)
    # The job inherits this environment (sbatch --export=ALL): the venv's python first on PATH.
    env = {**job_env(), **cluster.env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    jobs = {}
    try:
        for name, submit in (("sbatch", submit_sbatch), ("submitit", submit_submitit)):
            work = tmp_path_factory.mktemp(name)
            for path in RECIPES.iterdir():
                if path.suffix != ".md":
                    shutil.copy2(path, work / path.name)
            job = jobs[name] = submit(cluster, work, env)
            # Signalled before the next submission (which takes seconds on a busy machine), so that
            # the job is still training: what --signal does before the time limit (submitit asks
            # for USR2, the recipe for USR1).
            deadline = time.monotonic() + 90
            while not job.has_checkpoint():
                assert time.monotonic() < deadline, job.output[-2000:]
                time.sleep(0.05)
            cluster.run("scancel", f"--signal={job.signal}", job.job_id)
            job.signalled = True
        for job in jobs.values():
            cluster.wait_sacct_state(job.job_id, "COMPLETED", timeout=120)
        yield jobs
    finally:
        cluster.cancel_submitted()


def restarts(cluster: SlurmCluster, job_id: str) -> int:
    """How many times SLURM restarted the job, from accounting (`sacct -D` lists every run)."""
    out = cluster.run("sacct", "-n", "-X", "-P", "-D", "-j", job_id, "-o", "State")
    return len([line for line in out.splitlines() if line.strip()]) - 1


def check_resumed(cluster: SlurmCluster, job: Submitted) -> str:
    output = job.output
    assert "Traceback" not in output, output[-3000:]
    run_dirs = list((job.work / "runs").glob("[0-9]*/[0-9]*/*"))
    assert len(run_dirs) == 1, run_dirs
    assert f"Preempted by SIG{job.signal}" in output, output[-3000:]
    assert f"restart of session '{job.job_id}'" in output, output[-3000:]
    assert "Restored all states from the checkpoint" in output
    assert f"finished at step 40 in {run_dirs[0]}" in output
    assert restarts(cluster, job.job_id) == 1, "requeued exactly once"
    return output


def test_sbatch_recipe_is_requeued_by_preemption_handler_and_resumes(
    recipes: dict[str, Submitted], slurm_cluster: SlurmCluster
) -> None:
    job = recipes["sbatch"]
    output = check_resumed(slurm_cluster, job)
    assert f"requeue: scontrol requeue {job.job_id}" in output
    assert not list(job.work.rglob("hpc_ckpt_*.ckpt")), "Lightning's own SLURM requeue must stay out of it"


def test_submitit_recipe_is_requeued_through_submitit_and_resumes(
    recipes: dict[str, Submitted], slurm_cluster: SlurmCluster
) -> None:
    job = recipes["submitit"]
    output = check_resumed(slurm_cluster, job)
    assert "requeue: through submitit" in output
    assert f"Requeued job {job.job_id}" in output
