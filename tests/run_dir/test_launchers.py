"""Two CPU ranks (gloo) agree on one run dir under each launcher and resume exactly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import JOB_MODULE, job_env, run_job, same_weights


@pytest.mark.long
@pytest.mark.edge
def test_lightning_launcher_ranks_share_one_run_dir_and_resume_exactly(tmp_path: Path) -> None:
    args = ("--devices", "2", "--loader", "plain", "--every", "0")
    ref = run_job(tmp_path / "ref", tmp_path / "ref.pt", *args, "--epochs", "2")
    assert ref.returncode == 0, ref.output
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(root, out, *args, "--epochs", "1", LIGHTNING_RESUME_KEY="ddp-job")
    assert first.returncode == 0, first.output
    second = run_job(root, out, *args, "--epochs", "2", LIGHTNING_RESUME_KEY="ddp-job")
    assert second.returncode == 0, second.output
    assert [p for p in root.glob("[0-9]*/[0-9]*/*")] == [second.run_dir]
    assert same_weights(out, tmp_path / "ref.pt")


def test_torchrun_ranks_agree_through_the_handoff_and_leave_nothing_behind(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        JOB_MODULE,
        "--root",
        str(root),
        "--out",
        str(tmp_path / "o.pt"),
        "--devices",
        "2",
        "--epochs",
        "1",
    ]
    proc = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(list(root.glob("[0-9]*/[0-9]*/*"))) == 1
    assert list((root / ".handoff").iterdir()) == []  # rank 1's request and its answer, withdrawn
