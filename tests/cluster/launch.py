"""The test training job (``tests/jobs/train_job.py``) launched across the nodes of a :class:`Cluster`.

Two launchers, one process per node: ``torchrun`` (c10d rendezvous on the first node, the same
``--rdzv-id`` every launch) and Lightning's own multi-node launch (``MASTER_ADDR``/``MASTER_PORT``/
``NODE_RANK``/``WORLD_SIZE`` per node). Both get ``LIGHTNING_RESUME_KEY``, the job's name that survives a
relaunch (by hand, torchrun's run id with restart count 0 names a new run, not a restart). The
rendezvous address is the first node's hostname, which every node resolves to its bridge address, and
gloo talks on ``eth0``: the ranks reach each other only across the bridge.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from conftest import JOB_MODULE, job_env

from .cluster import IFNAME, Node

#: The rendezvous port on the first node (each node has a network namespace, and so ports, of its own).
PORT = 29500
#: 96 samples, batch 8, one rank per node on two nodes: 6 steps per epoch, saved every 2 steps.
ARGS = ("--devices", "1", "--loader", "plain", "--epochs", "2", "--every", "2")
#: The same training as one command on one machine: two ranks, Lightning's DDP launch.
SINGLE = ("--devices", "2", "--loader", "plain", "--epochs", "2", "--every", "2")
KEY = "cluster-job"


def torchrun(
    nodes: Sequence[Node], root: Path, out: Path, log: Path, *extra: str
) -> list[subprocess.Popen[bytes]]:
    """``torchrun --nnodes=N --nproc-per-node=1`` on each node, the same command on all."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(nodes)}", "--nproc-per-node=1"]
    command += ["--rdzv-backend=c10d", f"--rdzv-endpoint={nodes[0].hostname}:{PORT}", f"--rdzv-id={KEY}"]
    command += ["--max-restarts=0", "-m", JOB_MODULE, "--root", str(root), "--out", str(out)]
    command += ["--nodes", str(len(nodes)), *ARGS, *extra]
    env = job_env(LIGHTNING_RESUME_KEY=KEY, GLOO_SOCKET_IFNAME=IFNAME)
    return [node.popen(command, env=env, log=_log(log, node)) for node in nodes]


def lightning(
    nodes: Sequence[Node],
    root: Path,
    out: Path,
    log: Path,
    *extra: str,
    module: str = JOB_MODULE,
    args: Sequence[str] = ARGS,
) -> list[subprocess.Popen[bytes]]:
    """The job (``module``, with ``args``) started once per node, ``NODE_RANK`` its place in ``nodes``;
    Lightning makes the group."""
    command = [sys.executable, "-m", module, "--root", str(root), "--out", str(out)]
    command += ["--nodes", str(len(nodes)), *args, *extra]
    processes = []
    for rank, node in enumerate(nodes):
        env = job_env(
            LIGHTNING_RESUME_KEY=KEY,
            MASTER_ADDR=nodes[0].hostname,
            MASTER_PORT=PORT,
            NODE_RANK=rank,
            WORLD_SIZE=len(nodes),
            GLOO_SOCKET_IFNAME=IFNAME,
        )
        processes.append(node.popen(command, env=env, log=_log(log, node)))
    return processes


Launcher = Callable[..., list[subprocess.Popen[bytes]]]
LAUNCHERS: dict[str, Launcher] = {"torchrun": torchrun, "lightning": lightning}


def _log(log: Path, node: Node) -> Path:
    return log.with_name(f"{log.name}-{node.hostname}.log")


def logs(log: Path, nodes: Sequence[Node]) -> str:
    """Every node's output of one launch, each under a header."""
    parts = []
    for node in nodes:
        path = _log(log, node)
        text = path.read_text(errors="replace") if path.exists() else "(no output)"
        parts.append(f"===== {node.hostname} ({path}) =====\n{text}")
    return "\n".join(parts)


def wait(processes: Sequence[subprocess.Popen[bytes]], timeout: float) -> list[int | None]:
    """Exit statuses once all have ended, ``None`` for any still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    return [process.poll() for process in processes]


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)
