"""Training jobs across two real nodes, on both launchers: one run dir for all nodes, an uninterrupted
single command's weights bit for bit; a node lost mid-run (every process, its memory and /tmp gone) and
the job relaunched on the survivor plus a fresh node resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import same_weights

from lightning_resume.run_dir import layout

from .cluster import Cluster, pids_in
from .launch import LAUNCHERS, logs, wait, wait_for

pytestmark = pytest.mark.multinode

#: Rank 1 stops itself (SIGSTOP) once step 7 is done; the last save was at step 6.
STOP_AT, SAVED_AT = 7, 6


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_two_nodes_agree_on_one_run_dir_and_train_as_one_command_does(
    cluster: Cluster, launcher: str, reference: Path, tmp_path: Path
) -> None:
    nodes, root, out = cluster.nodes, tmp_path / "runs", tmp_path / "out.pt"
    before = [node.link_bytes() for node in nodes]
    job = LAUNCHERS[launcher](nodes, root, out, tmp_path / "job")
    assert wait(job, 300) == [0, 0], logs(tmp_path / "job", nodes)

    (run_dir,) = layout.run_dirs(root)
    assert json.loads(Path(f"{out}.json").read_text())["run_dir"] == str(run_dir)
    for node in nodes:
        text = logs(tmp_path / "job", [node])
        assert f"RunDir {run_dir} (fresh run" in text, text
    assert same_weights(out, reference)
    for node, (rx, tx) in zip(nodes, before, strict=True):  # the gradients went over the bridge, both ways
        now_rx, now_tx = node.link_bytes()
        assert now_rx - rx > 100_000 and now_tx - tx > 100_000, (node, now_rx - rx, now_tx - tx)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_node_lost_mid_run_and_the_job_relaunched_on_a_fresh_node_resumes_exactly(
    cluster: Cluster, launcher: str, reference: Path, tmp_path: Path
) -> None:
    launch, root, out = LAUNCHERS[launcher], tmp_path / "runs", tmp_path / "out.pt"
    node0, node1 = cluster.nodes
    stop = ("--signal-at", str(STOP_AT), "--signal-name", "SIGSTOP", "--signal-rank", "1")
    first = launch([node0, node1], root, out, tmp_path / "first", *stop)
    wait_for(
        lambda: node1.stopped() or any(p.poll() is not None for p in first), 300, "rank 1 to stop at step 7"
    )
    assert node1.stopped(), logs(tmp_path / "first", cluster.nodes)
    assert node1.run(["sh", "-c", "echo node-local > /dev/shm/lost"]).returncode == 0

    memory = node1.mount_namespace
    node1.kill()  # the node is lost: its agent and rank at once, its memory and /tmp with them
    assert not pids_in("mnt", memory)  # no process holds its /dev/shm any longer: the tmpfs is gone
    # Node 0's rank fails on the broken connection; whatever still runs there a scheduler would cancel.
    if wait(first[:1], 120) == [None]:
        node0.stop_processes()
    assert first[0].returncode != 0, logs(tmp_path / "first", cluster.nodes)
    (run_dir,) = layout.run_dirs(root)
    saved = torch.load(layout.last_checkpoint(run_dir), map_location="cpu", weights_only=False)
    assert saved["global_step"] == SAVED_AT

    node2 = cluster.add_node()  # a fresh node: nothing of node1's memory
    assert node2.run(["ls", "-A", "/dev/shm"]).stdout == ""
    again = launch([node0, node2], root, out, tmp_path / "again")
    assert wait(again, 300) == [0, 0], logs(tmp_path / "again", [node0, node2])
    text = logs(tmp_path / "again", [node0, node2])
    assert layout.run_dirs(root) == [run_dir]
    assert f"Restart of run {run_dir.name}" in text, text
    for rank in (0, 1):
        assert f"FIRST_STEP rank={rank} step={SAVED_AT}" in text, text
    assert same_weights(out, reference)
