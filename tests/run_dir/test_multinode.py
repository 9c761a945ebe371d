"""Two "nodes" on one machine: two ``torchrun`` agents that meet through c10d rendezvous on localhost.

Each node has its own node-local directory (``TMPDIR``) holding ``last.ckpt``; the runs root and the
checkpoint mirror are shared. Global rank 0 owns the run dir (both nodes have local rank 0), and a
whole-job kill followed by a relaunch onto empty node-local directories resumes exactly: each node
restores ``last.ckpt`` from the mirror once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import JOB_MODULE, job_env, same_weights

from lightning_resume.run_dir import layout

NODES = 2
EPOCHS = 2  # 96 samples, batch 8, 2 ranks: 6 steps per epoch
KILL_AT = 7
ARGS = ("--nodes", str(NODES), "--loader", "plain", "--epochs", str(EPOCHS), "--local-ckpt")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(work: Path, name: str, root: Path, mirror: Path, *extra: str) -> list[subprocess.Popen[bytes]]:
    """Start one torchrun agent per node, each in a session of its own with its own ``TMPDIR``."""
    port = free_port()
    agents = []
    for node in range(NODES):
        local = work / name / f"node{node}"
        local.mkdir(parents=True)
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", "--nproc-per-node=1"]
        command += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={name}"]
        command += [
            "--max-restarts=0",
            "-m",
            JOB_MODULE,
            "--root",
            str(root),
            "--out",
            str(work / f"{name}.pt"),
        ]
        command += [*ARGS, "--mirror", f"file://{mirror}", *extra]
        env = job_env(
            TMPDIR=str(local), LIGHTNING_RESUME_KEY="multinode", TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
        )
        with open(work / f"{name}-node{node}.log", "wb") as log:
            agents.append(
                subprocess.Popen(
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
    return agents


def finish(agents: list[subprocess.Popen[bytes]], timeout: float = 600) -> list[int]:
    """Wait for every agent; once one dies, the others get a moment and are then killed (a job kill)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and all(a.poll() is None for a in agents):
        time.sleep(0.2)
    for agent in agents:
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=60 if agent.poll() is None else 0)
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)  # a scheduler kills the whole job, every node
            agent.wait()
    return [a.returncode for a in agents]


def log(work: Path, name: str, node: int) -> str:
    return (work / f"{name}-node{node}.log").read_text(errors="replace")


@pytest.mark.timeout(1200)
@pytest.mark.slow
def test_two_node_job_killed_and_relaunched_onto_empty_local_disks_resumes_exactly(tmp_path: Path) -> None:
    reference = launch(tmp_path, "reference", tmp_path / "ref-runs", tmp_path / "ref-mirror")
    assert finish(reference) == [0, 0], log(tmp_path, "reference", 0) + log(tmp_path, "reference", 1)

    root, mirror = tmp_path / "runs", tmp_path / "mirror"
    killed = launch(tmp_path, "first", root, mirror, "--kill-at", str(KILL_AT))
    codes = finish(killed)
    assert codes[0] != 0, log(tmp_path, "first", 0)
    (run_dir,) = layout.run_dirs(root)  # one run dir: rank 1 (also local rank 0) adopted rank 0's
    saved = torch.load(mirror / "last.ckpt", weights_only=True)["global_step"]
    assert 0 < saved < KILL_AT

    again = launch(tmp_path, "second", root, mirror)  # new, empty node-local directories
    assert finish(again) == [0, 0], log(tmp_path, "second", 0) + log(tmp_path, "second", 1)
    assert layout.run_dirs(root) == [run_dir]
    assert same_weights(tmp_path / "second.pt", tmp_path / "reference.pt")
    for node in range(NODES):
        text = log(tmp_path, "second", node)
        restored = [line for line in text.splitlines() if "restored" in line and "last.ckpt" in line]
        assert len(restored) == 1, f"node {node} restored last.ckpt {len(restored)} times:\n{text}"
        assert (tmp_path / "second" / f"node{node}" / "ckpt" / "last.ckpt").is_file()
        assert f"Restart of run {run_dir.name}" in text
