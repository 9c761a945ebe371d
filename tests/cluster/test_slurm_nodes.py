"""The training job under a real SLURM whose compute nodes are namespace nodes, one ``slurmd`` each
(``slurm_nodes.py``): ``sbatch -N 2`` trains across two nodes as one command on one machine does, bit
for bit; ``scontrol requeue`` in the middle runs it again in the same run dir from its last save; a
node lost in the middle is set DOWN by slurmctld and the requeued job resumes exactly on the two nodes
left.

The batch script runs ``srun`` (one task per node, Lightning's SLURM environment: ``SLURM_PROCID``,
``SLURM_NODEID``, the first node of ``SLURM_JOB_NODELIST`` as the rendezvous address), with gloo on each
node's ``eth0``. The run dir is found again through the SLURM job id, which a requeue keeps.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch
from conftest import JOB_MODULE, job_env, same_weights

from lightning_resume.run_dir import layout

from .cluster import IFNAME, Cluster, Node
from .launch import ARGS
from .slurm_nodes import SlurmNodes, job_script, output, quote, unavailable

pytestmark = pytest.mark.multinode

#: In the job's first run, rank 1 stops itself (SIGSTOP) once its ``last.ckpt`` is at this step: as
#: step 7 starts (the requeue test: the job is requeued in step 7), or as step 8 starts (the node-loss
#: test: step 7 is lost with the node and done again). Whatever this machine's speed, the scheduler then
#: acts at that point of the run.
SAVED_AT = 6


def stop(step: int) -> tuple[str, ...]:
    """Job options: rank 1 stops itself (``SIGSTOP``) once ``step`` steps are done."""
    return ("--signal-at", str(step), "--signal-name", "SIGSTOP", "--signal-rank", "1")


#: PreemptionHandler's line (rank 0): the step all ranks stopped and saved at.
#: Rank 0's stop line: its own SIGTERM, or rank 1's when that reached the agreement first (a busy node).
PREEMPTED = re.compile(r"^0: .*Preempted by (?:SIGTERM|a signal on another rank) at step (\d+):", re.M)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def slurm_support(cluster_support: None, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip (fail under CI) where SLURM cannot run one slurmd per namespace node."""
    reason = unavailable(str(tmp_path_factory.mktemp("slurm-probe")))
    if reason:
        message = f"no SLURM on namespace nodes here: {reason}"
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture
def partition(slurm_support: None, tmp_path: Path) -> Iterator[Callable[[int], SlurmNodes]]:
    """``partition(n)``: ``n`` namespace nodes (``tmp_path`` their shared filesystem) with one slurmd
    each, every node idle. Everything is stopped and removed when the test ends, however it ends."""
    with contextlib.ExitStack() as stack:

        def make(n: int) -> SlurmNodes:
            cluster = stack.enter_context(Cluster(n, workdir=tmp_path))
            return stack.enter_context(SlurmNodes(cluster))

        yield make


def submit(slurm: SlurmNodes, tmp_path: Path, *extra: str, first: Sequence[str] = ()) -> tuple[str, Path]:
    """``sbatch -N 2 --ntasks-per-node=1 --requeue`` of the training job under ``srun`` (``extra``: more
    job options; ``first``: options for its first run only, not for a restart); the job id and its
    output file (appended to across restarts, every task's lines prefixed with its rank)."""
    command = [sys.executable, "-m", JOB_MODULE, "--root", str(tmp_path / "runs")]
    command += ["--out", str(tmp_path / "out.pt"), "--nodes", "2", *ARGS, *extra]
    script = job_script(
        tmp_path / "job.sh",
        [
            'echo "BATCH restart=${SLURM_RESTART_COUNT:-0} host=$(hostname) nodes=$SLURM_JOB_NODELIST"',
            f'first=(); [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ] && first=({quote(first)})',
            'exec srun --label bash -c \'echo "TASK $SLURM_PROCID on $(hostname)"; exec "$@"\' task '
            + quote(command)
            + ' "${first[@]}"',
        ],
    )
    log = tmp_path / "job.log"
    job = slurm.sbatch(
        "--job-name=train",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",
        "--requeue",
        "--open-mode=append",
        f"--output={log}",
        f"--chdir={tmp_path}",
        str(script),
        env=job_env(GLOO_SOCKET_IFNAME=IFNAME),
    )
    return job, log


def attempts(log: Path) -> list[str]:
    """The job's output, one part per run of its batch script."""
    return [part for part in re.split(r"^(?=BATCH restart=)", output(log), flags=re.M) if part]


def hostnames(slurm: SlurmNodes, nodelist: str) -> list[str]:
    return slurm.run("scontrol", "show", "hostnames", nodelist).split()


def state(record: dict[str, str], wanted: str, restarts: int = 0) -> bool:
    return record.get("JobState") == wanted and int(record.get("Restarts", "0")) >= restarts


def saved_step(root: Path) -> int:
    """The step of the run's ``last.ckpt`` (-1 while there is none)."""
    run_dirs = layout.run_dirs(root) if root.exists() else []
    found = [layout.last_checkpoint(run_dir) for run_dir in run_dirs]
    steps = [
        torch.load(p, map_location="cpu", weights_only=False)["global_step"] for p in found if p.exists()
    ]
    return max(steps, default=-1)


def frozen(node: Node, root: Path, step: int) -> Callable[[dict[str, str]], bool]:
    """Running, with the job's rank on ``node`` stopped (``SIGSTOP``) and ``last.ckpt`` at ``step``
    (complete: it is renamed into place)."""
    return lambda record: state(record, "RUNNING") and bool(node.stopped()) and saved_step(root) == step


def check_resumed(text: str, run_dir: Path, step: int) -> None:
    """Both ranks of one attempt found ``run_dir`` again and resumed from ``step``."""
    for rank in (0, 1):
        assert re.search(rf"^{rank}: .*RunDir {re.escape(str(run_dir))} \(restart of session", text, re.M), (
            text
        )
        assert f"{rank}: FIRST_STEP rank={rank} step={step}" in text, text
    assert f"Restart of run {run_dir.name}: resuming from" in text, text


def test_sbatch_on_two_slurmd_nodes_trains_as_one_command_does(
    partition: Callable[[int], SlurmNodes], reference: Path, tmp_path: Path
) -> None:
    slurm = partition(2)
    before = [node.link_bytes() for node in slurm.nodes]
    started = time.monotonic()
    job, log = submit(slurm, tmp_path)
    record = slurm.wait_job(job, lambda r: state(r, "COMPLETED"), 300, "the job to complete", log)
    text = output(log)
    assert hostnames(slurm, record["NodeList"]) == ["node0", "node1"], record
    assert record["Restarts"] == "0" and record["ExitCode"] == "0:0", record
    assert "BATCH restart=0 host=node0 nodes=node[0-1]" in text, text
    assert "0: TASK 0 on node0" in text and "1: TASK 1 on node1" in text, text
    (run_dir,) = layout.run_dirs(tmp_path / "runs")
    for rank in (0, 1):
        assert re.search(rf"^{rank}: .*RunDir {re.escape(str(run_dir))} \(fresh run", text, re.M), text
    assert same_weights(tmp_path / "out.pt", reference), slurm.logs(log)
    for node, (rx, tx) in zip(slurm.nodes, before, strict=True):  # the gradients went over the bridge
        now_rx, now_tx = node.link_bytes()
        assert now_rx - rx > 100_000 and now_tx - tx > 100_000, (node, now_rx - rx, now_tx - tx)
    print(f"\n    sbatch -N 2 to COMPLETED: {time.monotonic() - started:.1f} s", end="")


def test_scontrol_requeue_mid_run_resumes_in_the_same_run_dir_exactly(
    partition: Callable[[int], SlurmNodes], reference: Path, tmp_path: Path
) -> None:
    slurm = partition(2)
    node1 = slurm.nodes[1]
    job, log = submit(slurm, tmp_path, "--preemption", "--print-saves", first=stop(SAVED_AT))
    slurm.wait_job(job, frozen(node1, tmp_path / "runs", SAVED_AT), 300, "rank 1 to stop", log)
    slurm.run("scontrol", "requeue", job)  # SIGCONT and SIGTERM to every task of the job, on each node
    requeued = time.monotonic()
    slurm.wait_job(job, lambda r: state(r, "RUNNING", 1), 120, "the requeued job to run", log)
    print(f"\n    scontrol requeue to running again: {time.monotonic() - requeued:.1f} s", end="")
    record = slurm.wait_job(job, lambda r: state(r, "COMPLETED", 1), 300, "the requeued job to complete", log)
    assert record["Restarts"] == "1", record
    first, again = attempts(log)
    assert first.startswith("BATCH restart=0") and again.startswith("BATCH restart=1"), output(log)
    for rank in (0, 1):  # SLURM's SIGTERM reached the rank on each node
        assert re.search(rf"^{rank}: .*SIGTERM received", first, re.M), first
    # Both ranks finished the step they were in (rank 1 once SIGCONT woke it), and saved there: a step
    # no periodic save is made at.
    assert PREEMPTED.findall(first) == [str(SAVED_AT + 1)], first
    for rank in (0, 1):
        assert f"{rank}: SAVED rank={rank} step={SAVED_AT + 1}" in first, first
    (run_dir,) = layout.run_dirs(tmp_path / "runs")
    check_resumed(again, run_dir, SAVED_AT + 1)
    assert same_weights(tmp_path / "out.pt", reference), slurm.logs(log)


def test_a_node_lost_mid_run_is_set_down_and_the_requeued_job_resumes_on_the_nodes_left(
    partition: Callable[[int], SlurmNodes], reference: Path, tmp_path: Path
) -> None:
    slurm = partition(3)
    node1 = slurm.nodes[1]
    job, log = submit(slurm, tmp_path, "--print-saves", first=stop(SAVED_AT + 1))
    record = slurm.wait_job(job, frozen(node1, tmp_path / "runs", SAVED_AT), 300, "rank 1 to stop", log)
    assert hostnames(slurm, record["NodeList"]) == ["node0", "node1"], record
    node1.kill()  # the node is lost: its slurmd, slurmstepd and rank at once
    killed = time.monotonic()
    # slurmctld hears nothing from it for SlurmdTimeout, sets it DOWN, and requeues the job (--requeue).
    states = slurm.wait_nodes(["node1"], {"DOWN"}, 90, "DOWN after the node loss")
    down = time.monotonic()
    assert "NOT_RESPONDING" in states["node1"], states
    again = slurm.wait_job(job, lambda r: state(r, "RUNNING", 1), 120, "the requeued job to run", log)
    print(
        f"\n    node1 killed to DOWN: {down - killed:.1f} s, to the job running again on "
        f"{again['NodeList']}: {time.monotonic() - killed:.1f} s",
        end="",
    )
    assert hostnames(slurm, again["NodeList"]) == ["node0", "node2"], again
    record = slurm.wait_job(job, lambda r: state(r, "COMPLETED", 1), 300, "the requeued job to complete", log)
    assert record["Restarts"] == "1", record
    _, restart = attempts(log)
    ctld = output(slurm.log_dir / "slurmctld.log")
    assert f"requeue job JobId={job} due to failure of node node1" in ctld, ctld
    assert restart.startswith("BATCH restart=1 host=node0 nodes=node[0,2]"), output(log)
    assert "1: TASK 1 on node2" in restart, restart
    (run_dir,) = layout.run_dirs(tmp_path / "runs")
    check_resumed(restart, run_dir, SAVED_AT)  # from the last save before the loss
    assert same_weights(tmp_path / "out.pt", reference), slurm.logs(log)
