"""Which nodes hold replicas, and which copy a restart loads: never an older save than the durable one."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_resume._storage.manifest import Entry
from lightning_resume.io.memory.placement import Copy, choose, copy_path, origin_of, peers, run_key, safe_part


def entry(step: int, checksum: str = "aa", saved_at: float | None = None) -> Entry:
    return Entry(
        size=10, checksum=checksum, global_step=step, saved_at=float(step) if saved_at is None else saved_at
    )


def copy(node: int, step: int, checksum: str = "aa", origin: int = 0) -> Copy:
    return Copy(node, f"host{node}", origin, "last.ckpt", entry(step, checksum))


@pytest.mark.parametrize(
    ("node", "nodes", "replicas", "expected"),
    [
        (0, 2, 1, [1]),
        (1, 2, 1, [0]),
        (2, 3, 1, [0]),  # an odd node count: a ring, not pairs
        (0, 3, 2, [1, 2]),
        (1, 3, 5, [2, 0]),  # more replicas than other nodes: each other node once
        (0, 1, 1, []),
        (0, 4, 0, []),
    ],
)
def test_replicas_go_to_the_next_nodes_around_the_ring(
    node: int, nodes: int, replicas: int, expected: list[int]
) -> None:
    assert peers(node, nodes, replicas) == expected


def test_every_node_is_a_replica_holder_for_exactly_as_many_nodes_as_it_sends_to() -> None:
    for nodes in (2, 3, 5):
        held = [0] * nodes
        for node in range(nodes):
            for peer in peers(node, nodes, 1):
                held[peer] += 1
        assert held == [1] * nodes  # memory bounded: one replica per node, whatever the count


def test_the_newest_memory_copy_wins_over_an_older_durable_one_own_node_first() -> None:
    copies = [copy(1, 8), copy(0, 8), copy(2, 6)]
    chosen = choose(copies, "last.ckpt", entry(2, "dd"), node=0)
    assert [c.node for c in chosen] == [0, 1]
    assert [c.node for c in choose(copies, "last.ckpt", entry(2, "dd"), node=2)] == [0, 1]  # by node


def test_a_newer_durable_save_wins_and_so_does_another_save_at_the_same_step() -> None:
    copies = [copy(1, 8)]
    assert choose(copies, "last.ckpt", entry(10, "dd"), node=0) == []  # preempted: durable is newer
    # Two saves at one step (accumulation): the durable one is the later.
    assert choose(copies, "last.ckpt", entry(8, "dd", saved_at=9.0), node=0) == []


def test_the_same_save_on_both_tiers_loads_from_memory() -> None:
    copies = [copy(1, 8, "cc")]
    assert choose(copies, "last.ckpt", entry(8, "cc"), node=0) == copies


def test_without_a_durable_copy_or_memory_copies() -> None:
    assert choose([], "last.ckpt", entry(2), node=0) == []
    assert choose([copy(0, 4)], "last.ckpt", None, node=0) == [copy(0, 4)]
    assert choose([copy(0, 4)], "other.ckpt", None, node=0) == []


def test_only_copies_of_the_newest_save_are_candidates() -> None:
    copies = [copy(0, 8, "aa"), copy(1, 8, "bb", origin=1), copy(2, 8, "aa")]
    chosen = choose(copies, "last.ckpt", None, node=1)
    assert {c.entry.checksum for c in chosen} == {"aa"}


def test_each_run_and_writing_node_has_its_folder(tmp_path: Path) -> None:
    a, b = run_key(tmp_path / "run-a" / "checkpoints"), run_key(tmp_path / "run-b" / "checkpoints")
    assert a != b and safe_part(a) and safe_part(b)
    path = copy_path(tmp_path, a, 3, "last.ckpt")
    assert origin_of(path) == 3
    assert not safe_part("../x") and not safe_part("a/b") and not safe_part("")
