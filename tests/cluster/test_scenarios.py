"""What the single-machine tests imitate, on real namespace nodes: a SIGTERM that reaches one node only
stops every node at one step with one durable save, and the relaunch resumes exactly; ``last.ckpt`` on
each node's own disk with a mirror survives the loss of that node; a rank hung on one node is reported
by the watchdogs of both nodes, each within its own timeout."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import same_weights

from lightning_resume.run_dir import hangs, layout
from lightning_resume.watchdog.progress_watchdog import ProgressWatchdog

from .cluster import Cluster, Node
from .launch import LAUNCHERS, logs, wait, wait_for

pytestmark = pytest.mark.multinode

EXIT = 143  #: PreemptionHandler's exit status: 128 + SIGTERM


def job_pids(node: Node) -> list[int]:
    """The training processes of ``node`` (not the ``nsenter`` that waits for them)."""
    found = []
    for pid in node.pids():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"jobs.train_job" in command:
            found.append(pid)
    return found


def test_a_sigterm_on_one_node_stops_every_node_at_one_step_and_the_relaunch_is_exact(
    cluster: Cluster, reference: Path, tmp_path: Path
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    node0, node1 = cluster.nodes
    slow = ("--preemption", "--print-saves", "--step-sleep", "0.3")
    first = LAUNCHERS["lightning"]([node0, node1], root, out, tmp_path / "first", *slow)
    saved = tmp_path / "first-node0.log"
    wait_for(lambda: saved.exists() and "SAVED rank=0 step=4" in saved.read_text(), 300, "the save at step 4")
    (pid,) = job_pids(node1)
    os.kill(pid, signal.SIGTERM)  # the scheduler's signal reaches node1 only
    assert wait(first, 120) == [EXIT, EXIT], logs(tmp_path / "first", cluster.nodes)
    text = logs(tmp_path / "first", cluster.nodes)
    stops = {line.split(" at step ")[1].split(":")[0] for line in text.splitlines() if "Preempted by" in line}
    assert len(stops) == 1, text  # both nodes stopped at the same step
    (run_dir,) = layout.run_dirs(root)
    step = torch.load(layout.last_checkpoint(run_dir), map_location="cpu", weights_only=False)["global_step"]
    assert str(step) in stops and step > 4

    again = LAUNCHERS["lightning"]([node0, node1], root, out, tmp_path / "again", "--preemption")
    assert wait(again, 300) == [0, 0], logs(tmp_path / "again", cluster.nodes)
    assert f"FIRST_STEP rank=1 step={step}" in logs(tmp_path / "again", cluster.nodes)
    assert same_weights(out, reference)


def test_node_local_checkpoints_with_a_mirror_survive_the_loss_of_a_node(
    cluster: Cluster, reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", "/tmp")  # inside a node: its own tmpfs
    root, out, mirror = tmp_path / "runs", tmp_path / "out.pt", tmp_path / "mirror"
    node0, node1 = cluster.nodes
    local = ("--local-ckpt", "--mirror", f"file://{mirror}")  # last.ckpt in each node's own /tmp
    stop = ("--signal-at", "7", "--signal-name", "SIGSTOP", "--signal-rank", "1")
    first = LAUNCHERS["lightning"]([node0, node1], root, out, tmp_path / "first", *local, *stop)
    wait_for(lambda: node1.stopped() or any(p.poll() is not None for p in first), 300, "rank 1 to stop")
    assert node1.stopped(), logs(tmp_path / "first", cluster.nodes)
    wait_for(
        lambda: (
            (mirror / "last.ckpt").exists()
            and torch.load(mirror / "last.ckpt", weights_only=False)["global_step"] == 6
        ),
        60,
        "the upload of step 6",
    )
    assert node0.run(["sh", "-c", "ls /tmp/ckpt"]).stdout.split() != []  # rank 0's node-local copy
    node1.kill()
    node0.kill()  # both nodes lost: their /tmp with them; only the mirror is left
    node2, node3 = cluster.add_node(), cluster.add_node()
    again = LAUNCHERS["lightning"]([node2, node3], root, out, tmp_path / "again", *local)
    assert wait(again, 300) == [0, 0], logs(tmp_path / "again", [node2, node3])
    text = logs(tmp_path / "again", [node2, node3])
    for rank in (0, 1):
        assert f"FIRST_STEP rank={rank} step=6" in text, text
    assert same_weights(out, reference)


def test_a_rank_hung_on_one_node_is_reported_by_the_watchdogs_of_both_nodes(
    cluster: Cluster, tmp_path: Path
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    hang = ("--hang", "step", "--hang-at", "5", "--hang-rank", "1", "--min-timeout", "4")
    job = LAUNCHERS["lightning"](
        cluster.nodes,
        root,
        out,
        tmp_path / "hang",
        *hang,
        module="jobs.watchdog_job",
        args=("--devices", "1", "--epochs", "2", "--every", "2"),
    )
    code = ProgressWatchdog.HANG_EXIT_CODE
    assert wait(job, 300) == [code, code], logs(tmp_path / "hang", cluster.nodes)
    text = logs(tmp_path / "hang", cluster.nodes)
    (run_dir,) = layout.run_dirs(root)
    notes = {note.rank: note for note in hangs.read_notes(run_dir)}
    assert sorted(notes) == [0, 1], text  # node1's rank blocked in its step, node0's waited for it
    for rank, note in notes.items():
        assert (note.section, note.step) == ("step", 5), note
        assert note.seconds < 4.0 + 20, note  # its own timeout, not gloo's 30 minutes
        assert note.host == f"node{rank}", note
        assert (run_dir / note.stacks).exists()
    assert "block_forever" in (run_dir / notes[1].stacks).read_text()
