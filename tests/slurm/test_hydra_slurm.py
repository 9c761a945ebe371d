"""The Hydra recipe (``docs/src/recipes/hydra_train.py``) through hydra-submitit-launcher on the real local
SLURM cluster: submitted with ``-m hydra/launcher=submitit_slurm`` as a user would, ``scontrol requeue``d
once it has a checkpoint, requeued exactly once, ``COMPLETED``, and bitwise equal to an uninterrupted run."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import job_env

from .conftest import SlurmCluster

pytestmark = pytest.mark.slurm

RECIPES = Path(__file__).resolve().parents[2] / "docs" / "src" / "recipes"
BIN = Path(sys.executable).parent
TRAIN = ("max_steps=40", "every=4")


def copy_recipes(work: Path) -> Path:
    work.mkdir(parents=True)
    for path in RECIPES.iterdir():
        if path.is_file() and path.suffix != ".md":
            shutil.copy2(path, work / path.name)
    return work


def wait_for(predicate: object, what: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        assert proc.poll() is None, (
            f"launcher exited with {proc.returncode} first:\n{log.read_text()[-3000:]}"
        )
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout}s:\n{log.read_text()[-3000:]}")


@pytest.mark.slow
def test_hydra_submitit_job_is_requeued_once_and_resumes_exactly(slurm: SlurmCluster, tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    env = {**job_env(), **slurm.env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    # The uninterrupted reference, here and now, while the SLURM job runs on one CPU.
    ref_work = copy_recipes(tmp_path / "reference")
    reference = subprocess.Popen(
        [sys.executable, "train.py", "--max-steps", "40", "--every", "4"],
        cwd=ref_work,
        env={**env, "LIGHTNING_RESUME_KEY": "reference"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    work = copy_recipes(tmp_path / "work")
    log = tmp_path / "launcher.log"
    cmd = [
        sys.executable,
        "hydra_train.py",
        "-m",  # Hydra uses a launcher only for a multirun; one job is submitted as a plain job
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.timeout_min=60",  # submitit counts every signal as a time-out when <= 10
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.partition=low",
        *TRAIN,
        "step_sleep=0.1",
    ]
    with log.open("w") as out:
        launcher = subprocess.Popen(
            cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        found: list[str] = []

        def submitted() -> bool:
            found[:] = [p.name for p in work.glob("multirun/*/*/.submitit/*") if re.fullmatch(r"\d+", p.name)]
            return bool(found)

        wait_for(submitted, "submitted job", 120, launcher, log)
        (job_id,) = found
        slurm.submitted.append(job_id)
        wait_for(
            lambda: any((work / "runs").glob("[0-9]*/[0-9]*/*/checkpoints/last.ckpt")),
            "checkpoint",
            240,
            launcher,
            log,
        )
        slurm.run("scontrol", "requeue", job_id)  # what a preemption by the scheduler does
        launcher.wait(timeout=300)  # the launcher waits for the job's result, as a multirun does
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 0, log.read_text()[-3000:]
    slurm.wait_sacct_state(job_id, "COMPLETED", timeout=120)
    runs = slurm.run("sacct", "-n", "-X", "-P", "-D", "-j", job_id, "-o", "State")
    assert len([line for line in runs.splitlines() if line.strip()]) == 2, f"requeued exactly once: {runs}"

    (folder,) = work.glob(f"multirun/*/*/.submitit/{job_id}")
    output = "".join(p.read_text() for p in sorted(folder.glob(f"{job_id}_0_log.*")))
    assert "Traceback" not in output, output[-3000:]
    (run_dir,) = (work / "runs").glob("[0-9]*/[0-9]*/*")
    assert "Preempted by SIGTERM" in output, output[-3000:]
    assert f"restart of session '{job_id}'" in output, output[-3000:]
    assert "Restored all states from the checkpoint" in output
    assert f"finished at step 40 in {run_dir}" in output
    # submitit keeps the job's Hydra output dir across the requeue: one, holding both attempts' logs.
    assert len(list(work.glob("multirun/*/*/0/.hydra"))) == 1

    assert reference.wait(timeout=300) == 0
    (ref_dir,) = (ref_work / "runs").glob("[0-9]*/[0-9]*/*")
    spec = importlib.util.spec_from_file_location("recipe_compare", RECIPES / "compare.py")
    assert spec is not None and spec.loader is not None
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    assert (
        compare.main(str(ref_dir / "checkpoints" / "last.ckpt"), str(run_dir / "checkpoints" / "last.ckpt"))
        == 0
    )
