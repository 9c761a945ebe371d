"""``inspect`` and ``gc --older-than 0s --apply``, run over and over while a job trains, take nothing.

Users run the tools from a login node while their jobs train. Each job here saves at every step (files
written aside and renamed, asynchronous ones by a writer process; sharded saves into ``.lr-save-*``
directories), and the tools run in a loop until it exits: the job must finish, with exactly the weights
of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import JOB_MODULE, built_once, job_env, same_weights

from lightning_resume import cli

SHARDED = "jobs.sharded_job"
JOBS = {
    "file, asynchronous": (JOB_MODULE, ("--durable", "--every", "1", "--step-sleep", "0.02")),
    "file, synchronous": (JOB_MODULE, ("--every", "1", "--step-sleep", "0.02")),
    "sharded, asynchronous": (SHARDED, ("--durable", "--every", "1")),
    "sharded, synchronous": (SHARDED, ("--every", "1")),
}


def start(module: str, root: Path, out: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", module, "--root", str(root), "--out", str(out), *args]
    return subprocess.Popen(
        command,
        env=job_env(LIGHTNING_RESUME_KEY="busy"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def reference(tmp_path_factory: pytest.TempPathFactory, module: str) -> Path:
    def build(folder: Path) -> None:
        job = start(module, folder / "runs", folder / "ref.pt")
        output, _ = job.communicate(timeout=420)
        assert job.returncode == 0, output[-4000:]

    return built_once(tmp_path_factory, f"tools-reference-{module}", build) / "ref.pt"


def tools_until(job: subprocess.Popen[str], root: Path) -> int:
    """Run ``gc --apply`` and ``inspect`` (the command line, in this process) until ``job`` exits."""
    rounds = 0
    while job.poll() is None:
        if not (root / ".index").is_dir():  # the job has not recorded its run yet
            continue
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert cli.main(["gc", str(root), "--older-than", "0s", "--apply", "--json"]) == 0
            assert cli.main(["inspect", str(root), "--json"]) == 0
            for run_dir in root.glob("[0-9]*/[0-9]*/*"):
                cli.main(["inspect", str(run_dir), "--json"])
        rounds += 1
    return rounds


@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.slow) if c != "file, synchronous" else c for c in JOBS],
)
def test_gc_and_inspect_in_a_loop_during_training_remove_nothing_the_job_needs(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, case: str
) -> None:
    module, args = JOBS[case]
    expected = reference(tmp_path_factory, module)
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    job = start(module, root, out, *args)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.append(job.stdout.read() if job.stdout else ""))
    reader.start()
    rounds = tools_until(job, root)
    reader.join()
    assert job.wait() == 0, "".join(output)[-4000:]
    assert rounds > 5
    assert same_weights(out, expected)
