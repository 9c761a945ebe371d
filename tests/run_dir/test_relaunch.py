"""The same two-node command relaunched at once after a node is lost resumes exactly, on two launchers.

A relaunch of one command has the launch key of the launch before it (torchrun with the same
``--rdzv-id`` starts again at restart count 0; Lightning's own multi-node launch has the same
``MASTER_ADDR``/``MASTER_PORT``). Global rank 0 of the relaunch comes up late, so that rank 1 looks for
the run dir first, while the first launch's files are seconds old: it must wait for this launch's
rank 0, never take the first launch's choice (which said "fresh run": rank 1 then skipped the restart
broadcast and both ranks waited on each other for good).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import JOB_MODULE, built_once, job_env, same_weights

from lightning_resume.run_dir import layout

ARGS = ("--nodes", "2", "--devices", "1", "--loader", "plain", "--epochs", "2", "--every", "2")
KILL_AT = 7  # 96 samples, batch 8, 2 ranks: 6 steps per epoch; saved at step 6
KEY = "relaunched"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(
    work: Path, name: str, node: int, command: list[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    with open(work / f"{name}-node{node}.log", "ab") as log:
        return subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def torchrun(work: Path, root: str, port: int, extra: tuple[str, ...]) -> list[subprocess.Popen[bytes]]:
    """One torchrun agent per node, c10d rendezvous on one endpoint, the same ``--rdzv-id`` every launch."""
    agents = []
    for node in range(2):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
        command += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={KEY}"]
        command += ["--max-restarts=0", "-m", JOB_MODULE, "--root", root, *ARGS, *extra]
        env = job_env(LIGHTNING_RESUME_KEY=KEY, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
        agents.append(_start(work, Path(root).name, node, command, env))
    return agents


def lightning(work: Path, root: str, port: int, extra: tuple[str, ...]) -> list[subprocess.Popen[bytes]]:
    """Lightning's own multi-node launch: the script started once per node with its ``NODE_RANK``."""
    processes = []
    for node in range(2):
        command = [sys.executable, "-m", JOB_MODULE, "--root", root, *ARGS, *extra]
        env = job_env(
            LIGHTNING_RESUME_KEY=KEY, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=node, WORLD_SIZE=2
        )
        processes.append(_start(work, Path(root).name, node, command, env))
    return processes


Launcher = Callable[[Path, str, int, tuple[str, ...]], list[subprocess.Popen[bytes]]]
LAUNCHERS: dict[str, Launcher] = {"torchrun": torchrun, "lightning": lightning}


def finish(processes: list[subprocess.Popen[bytes]], timeout: float = 300) -> list[int | None]:
    """Wait for every process; once one ends, the others get a minute, then are killed (their node lost)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and all(p.poll() is None for p in processes):
        time.sleep(0.1)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, min(60.0, deadline - time.monotonic())))
    codes = [p.poll() for p in processes]
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return codes


def logs(work: Path, name: str) -> str:
    return "".join((work / f"{name}-node{n}.log").read_text(errors="replace") for n in range(2))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def build(folder: Path) -> None:
        processes = torchrun(folder, str(folder / "runs"), free_port(), ("--out", str(folder / "ref.pt")))
        assert finish(processes) == [0, 0], logs(folder, "runs")

    return built_once(tmp_path_factory, "two-node-reference", build) / "ref.pt"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("launcher", [pytest.param(n, marks=pytest.mark.slow) for n in sorted(LAUNCHERS)])
def test_a_two_node_command_relaunched_at_once_after_a_node_loss_resumes_exactly(
    tmp_path: Path, launcher: str, reference: Path
) -> None:
    launch, root, out = LAUNCHERS[launcher], tmp_path / "runs", tmp_path / "out.pt"
    port = free_port()
    # Node 1's rank dies at a step after the save of step 6: its node is lost, the survivor fails.
    first = launch(
        tmp_path, str(root), port, ("--out", str(out), "--kill-at", str(KILL_AT), "--kill-rank", "1")
    )
    codes = finish(first)
    assert codes[1] != 0, logs(tmp_path, "runs")
    (run_dir,) = layout.run_dirs(root)
    handoffs = root / layout.HANDOFF_DIR
    assert not handoffs.is_dir() or not [p for p in handoffs.iterdir() if p.suffix == ".answer"]

    # The same command at once, rank 0 late: rank 1 asks first.
    again = launch(tmp_path, str(root), port, ("--out", str(out), "--rank0-delay", "3"))
    assert finish(again) == [0, 0], logs(tmp_path, "runs")
    assert layout.run_dirs(root) == [run_dir]
    assert f"Restart of run {run_dir.name}" in logs(tmp_path, "runs")
    assert same_weights(out, reference)
    assert not list(handoffs.iterdir())  # every request withdrawn with its answer
