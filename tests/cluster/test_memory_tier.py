"""``DurableCheckpointIO(memory=MemoryTier(...))`` on real namespace nodes: ``last.ckpt`` in each node's
own ``/dev/shm``, replicated over the bridge. A node lost with its memory: the relaunch restores the
newest save from the peer that holds its replica (2 and 3 nodes), exactly, also when the run's
checkpoint folder is lost too; the node and its replica lost: from the durable tier, exactly; a node
whose tmpfs is full saves to the durable tier; a sharded (FSDP2) 2-node job restores every shard from
memory after a node loss, exactly."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from conftest import job_env, same_weights

from lightning_resume._storage.catalog import check_file, verify
from lightning_resume._storage.kinds import DirectoryKind, resolve_pointer
from lightning_resume._storage.manifest import decode
from lightning_resume.cli.report import build
from lightning_resume.run_dir import attempts, layout

from .cluster import Cluster, Node
from .launch import LAUNCHERS, logs, wait, wait_for

pytestmark = pytest.mark.multinode

TIER = "/dev/shm/lightning_resume"
#: The durable tier gets the first save (step 2) only, until training ends.
MEMORY = ("--memory", TIER, "--durable-every", "1000")
#: Three ranks sum gradients in an order that depends on DDP's bucket layout, rebuilt after a process's
#: first step: a restart's first step would differ in the last bits. Kept as built, a resume is exact.
KEEP_BUCKETS = ("--strategy", "ddp_find_unused_parameters_true")


@pytest.fixture
def cluster3(cluster_support: None, tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(3, workdir=tmp_path) as made:
        yield made


def held_step(node: Node) -> int | None:
    """The step of the newest committed copy in ``node``'s memory tier (its own or a replica)."""
    found = node.run(["sh", "-c", f"cat {TIER}/*/node-*/last.ckpt.manifest.json 2>/dev/null"]).stdout
    return decode(found)[0].global_step if found.strip() else None


def durable_step(root: Path) -> int | None:
    (run_dir,) = layout.run_dirs(root)
    manifest = check_file(layout.last_checkpoint(run_dir)).manifest
    return manifest.global_step if manifest is not None else None


def lose_the_writer(
    nodes: Sequence[Node],
    launch: str,
    root: Path,
    out: Path,
    log: Path,
    stop_at: int,
    saved_at: int,
    extra: Sequence[str] = (),
) -> Node:
    """Train until global rank 0 (the writer) stops itself after step ``stop_at`` and the replica of the
    save at ``saved_at`` is on its peer; then lose the writer's node (processes, memory) and return it."""
    stop = ("--signal-at", str(stop_at), "--signal-name", "SIGSTOP", "--signal-rank", "0")
    first = LAUNCHERS[launch](nodes, root, out, log, *MEMORY, *stop, *extra)
    wait_for(
        lambda: any(n.stopped() for n in nodes) or any(p.poll() is not None for p in first),
        300,
        "rank 0 to stop",
    )
    (writer,) = [n for n in nodes if n.stopped()] or [None]
    assert writer is not None, logs(log, nodes)
    assert held_step(writer) == saved_at
    others = [n for n in nodes if n is not writer]
    wait_for(lambda: any(held_step(n) == saved_at for n in others), 60, "the replica on the peer")
    writer.kill()
    for node, process in zip(nodes, first, strict=True):
        if node is not writer and wait([process], 120) == [None]:
            node.stop_processes()
    assert durable_step(root) == 2  # the durable tier has the first save only
    return writer


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_lost_node_is_restored_from_its_peers_memory_exactly(
    cluster: Cluster, launcher: str, reference: Path, tmp_path: Path
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    lost = lose_the_writer(cluster.nodes, launcher, root, out, tmp_path / "first", stop_at=7, saved_at=6)
    (survivor,) = [n for n in cluster.nodes if n is not lost]
    fresh = cluster.add_node()
    again = LAUNCHERS[launcher]([survivor, fresh], root, out, tmp_path / "again", *MEMORY)
    assert wait(again, 300) == [0, 0], logs(tmp_path / "again", [survivor, fresh])
    text = logs(tmp_path / "again", [survivor, fresh])
    line = next((ln for ln in text.splitlines() if "restored " in ln), "")
    assert "(step 6) from the memory tier of node" in line and f"({survivor.hostname})" in line, text
    assert "from the durable tier" not in text
    for rank in (0, 1):
        assert f"FIRST_STEP rank={rank} step=6" in text, text
    assert same_weights(out, reference)
    assert durable_step(root) == 12  # the end of training is durable
    (run_dir,) = layout.run_dirs(root)
    report = build(attempts.read(run_dir), run_dir)  # what `lightning-resume report` shows
    row = report.restarts[-1]
    assert (row.restore_tier, row.resumed_from) == ("memory", 6), row
    assert row.restore_bytes and row.restore_seconds is not None and row.first_step is not None


def test_three_nodes_one_lost_restore_from_the_peer_exactly(cluster3: Cluster, tmp_path: Path) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    # Three ranks: 4 steps per epoch, 8 in all, saved every 2.
    lost = lose_the_writer(
        cluster3.nodes, "lightning", root, out, tmp_path / "first", stop_at=5, saved_at=4, extra=KEEP_BUCKETS
    )
    survivors = [n for n in cluster3.nodes if n is not lost]
    nodes = [*survivors, cluster3.add_node()]
    again = LAUNCHERS["lightning"](nodes, root, out, tmp_path / "again", *MEMORY, *KEEP_BUCKETS)
    assert wait(again, 300) == [0, 0, 0], logs(tmp_path / "again", nodes)
    text = logs(tmp_path / "again", nodes)
    assert "(step 4) from the memory tier of node" in text, text
    for rank in (0, 1, 2):
        assert f"FIRST_STEP rank={rank} step=4" in text, text
    once = LAUNCHERS["lightning"](
        nodes, tmp_path / "ref-runs", tmp_path / "ref.pt", tmp_path / "ref", *KEEP_BUCKETS
    )
    assert wait(once, 300) == [0, 0, 0], logs(tmp_path / "ref", nodes)
    assert same_weights(out, tmp_path / "ref.pt")


def test_a_node_and_its_replica_lost_restore_from_the_durable_tier_exactly(
    cluster: Cluster, reference: Path, tmp_path: Path
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    lose_the_writer(cluster.nodes, "lightning", root, out, tmp_path / "first", stop_at=7, saved_at=6)
    for node in cluster.alive:
        node.kill()  # the replica's node too: no memory copy is left anywhere
    nodes = [cluster.add_node(), cluster.add_node()]
    again = LAUNCHERS["lightning"](nodes, root, out, tmp_path / "again", *MEMORY)
    assert wait(again, 300) == [0, 0], logs(tmp_path / "again", nodes)
    text = logs(tmp_path / "again", nodes)
    assert "(step 2) from the durable tier" in text, text
    for rank in (0, 1):
        assert f"FIRST_STEP rank={rank} step=2" in text, text
    assert same_weights(out, reference)


def test_a_lost_node_and_a_lost_checkpoint_folder_restore_from_the_peers_memory_exactly(
    cluster: Cluster, reference: Path, tmp_path: Path
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    lost = lose_the_writer(cluster.nodes, "lightning", root, out, tmp_path / "first", stop_at=7, saved_at=6)
    (survivor,) = [n for n in cluster.nodes if n is not lost]
    (run_dir,) = layout.run_dirs(root)
    shutil.rmtree(layout.checkpoint_dir(run_dir))  # deleted, moved, a wrong dirpath: the step-2 save is gone
    fresh = cluster.add_node()
    again = LAUNCHERS["lightning"]([survivor, fresh], root, out, tmp_path / "again", *MEMORY)
    assert wait(again, 300) == [0, 0], logs(tmp_path / "again", [survivor, fresh])
    text = logs(tmp_path / "again", [survivor, fresh])
    line = next((ln for ln in text.splitlines() if "restored " in ln), "")
    assert "(step 6) from the memory tier of node" in line and f"({survivor.hostname})" in line, text
    for rank in (0, 1):
        assert f"FIRST_STEP rank={rank} step=6" in text, text
    assert same_weights(out, reference)


def test_a_node_whose_tmpfs_is_full_saves_to_the_durable_tier(
    cluster_support: None, reference: Path, tmp_path: Path
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    with Cluster(2, workdir=tmp_path, tmpfs_size="32k") as small:  # a checkpoint is ~60 kB
        job = LAUNCHERS["lightning"](small.nodes, root, out, tmp_path / "job", *MEMORY)
        assert wait(job, 300) == [0, 0], logs(tmp_path / "job", small.nodes)
        text = logs(tmp_path / "job", small.nodes)
    assert text.count("is full (") == 1, text
    assert "writing last.ckpt to the durable tier until it has room" in text
    assert same_weights(out, reference)
    (run_dir,) = layout.run_dirs(root)
    versions = decode(Path(f"{layout.last_checkpoint(run_dir)}.manifest.json").read_text())
    # Each save went to the durable tier (with room, only the first and the last would be there).
    assert [v.global_step for v in versions][:2] == [12, 10]


def sharded_durable_step(root: Path) -> int | None:
    (run_dir,) = layout.run_dirs(root)
    target = resolve_pointer(layout.checkpoint_dir(run_dir) / "last.ckpt")
    manifest = verify(target, DirectoryKind("last.ckpt")).manifest if target is not None else None
    return manifest.global_step if manifest is not None else None


@pytest.mark.parametrize("lost_node", [0, 1])
def test_a_sharded_two_node_job_restores_every_shard_from_memory_after_a_node_loss(
    cluster: Cluster, tmp_path: Path, lost_node: int
) -> None:
    """FSDP2 on one rank per node: each node's shard in its own memory and a replica on the other; a node
    lost after a kill (node 0 holds the set that names a save's files, node 1 its replica), the relaunch
    on the survivor and a fresh node assembles the newest save from the survivor's memory."""
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    sharded = functools.partial(LAUNCHERS["lightning"], module="jobs.sharded_job", args=("--devices", "1"))
    first = sharded(cluster.nodes, root, out, tmp_path / "first", *MEMORY, "--kill-after-step", "11")
    assert all(code not in (0, None) for code in wait(first, 300)), logs(tmp_path / "first", cluster.nodes)
    assert sharded_durable_step(root) == 3  # the durable tier has the first save only
    lost = cluster.nodes[lost_node]
    (survivor,) = [n for n in cluster.nodes if n is not lost]
    lost.kill()
    nodes = [survivor, cluster.add_node()]
    again = sharded(nodes, root, out, tmp_path / "again", *MEMORY)
    assert wait(again, 300) == [0, 0], logs(tmp_path / "again", nodes)
    text = logs(tmp_path / "again", nodes)
    found = re.search(r"\(step (\d+)\) from the memory tier of node 0 \(([\w-]+)\)", text)
    assert found is not None and found.group(2) == survivor.hostname, text
    step = int(found.group(1))
    assert step in (8, 9), text  # the newest save that every rank committed before the kill
    assert "from the durable tier" not in text
    assert json.loads(Path(f"{out}.json").read_text())["first_step"] == step
    reference = tmp_path / "ref.pt"
    once = subprocess.run(
        [sys.executable, "-m", "jobs.sharded_job", "--root", str(tmp_path / "ref"), "--out", str(reference)],
        env=job_env(LIGHTNING_RESUME_KEY="sharded-reference"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert once.returncode == 0, once.stderr[-3000:]
    assert same_weights(out, reference)
    assert sharded_durable_step(root) == 16  # the end of training is durable
