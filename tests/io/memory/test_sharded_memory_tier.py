"""Sharded checkpoints (FSDP2 under ``ModelParallelStrategy``, two CPU ranks) with
``DurableCheckpointIO(memory=MemoryTier(...))`` on one node: every rank's shard is committed in node
memory with the set that names the save; a restart after a SIGKILL assembles the newest complete set
and resumes from it exactly; a damaged shard falls back to the durable tier with one warning, exactly;
the end of training is durable. (Two nodes: ``tests/cluster/test_memory_tier.py``.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _system import mounted_tmpfs
from conftest import built_once, job_env, same_weights

from lightning_resume._storage.catalog import verify
from lightning_resume._storage.kinds import DirectoryKind, resolve_pointer
from lightning_resume._storage.manifest import Entry
from lightning_resume.io.memory.placement import Copy
from lightning_resume.io.sharded.in_memory import SET_FILE, ShardSet, held_name, parse_held, pick
from lightning_resume.run_dir import layout

JOB = "jobs.sharded_job"
#: The durable tier gets the first save (step 3) only, until training ends; saves every 3 steps and at
#: each epoch's end (8 steps).
MEMORY = ("--durable-every", "1000")


def run(root: Path, out: Path, *args: str | int) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", JOB, "--root", str(root), "--out", str(out), *map(str, args)]
    return subprocess.run(
        cmd,
        env=job_env(LIGHTNING_RESUME_KEY="sharded-memory"),
        capture_output=True,
        text=True,
        timeout=420,
        start_new_session=True,  # the job kills its own process group (every rank)
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def build(folder: Path) -> None:
        done = run(folder / "runs", folder / "ref.pt")
        assert done.returncode == 0, done.stderr[-4000:]

    return built_once(tmp_path_factory, "sharded-memory-reference", build) / "ref.pt"


def durable_step(root: Path) -> int | None:
    (run_dir,) = layout.run_dirs(root)
    pointer = layout.checkpoint_dir(run_dir) / "last.ckpt"
    target = resolve_pointer(pointer)
    assert target is not None
    manifest = verify(target, DirectoryKind("last.ckpt")).manifest
    return None if manifest is None else manifest.global_step


def newest_complete_set(tier: Path) -> ShardSet:
    """The newest set in the tier whose files are all there (what a restart must load)."""
    found = []
    for path in tier.glob(f"*/node-0/last.ckpt.*.{SET_FILE}"):
        shard_set = ShardSet.from_json(json.loads(path.read_text()))
        names = [held_name("last.ckpt", shard_set.gen, n) for n in shard_set.files]
        if all((path.parent / n).is_file() for n in names):
            found.append(shard_set)
    assert found, list(tier.rglob("*"))
    return max(found, key=lambda s: (s.step, s.saved_at))


def killed(tmp_path: Path, tier: Path) -> tuple[Path, ShardSet]:
    root = tmp_path / "runs"
    first = run(root, tmp_path / "out.pt", "--memory", tier, *MEMORY, "--kill-after-step", 11)
    assert first.returncode != 0, first.stderr[-4000:]
    assert durable_step(root) == 3
    held = newest_complete_set(tier)
    assert held.step in (8, 9) and held.world_size == 2, held  # newer than the durable tier's
    return root, held


@pytest.mark.slow
def test_a_sharded_restart_assembles_the_newest_save_from_node_memory_exactly(
    tmp_path: Path, reference: Path
) -> None:
    tier = tmp_path / "shm"
    root, held = killed(tmp_path, tier)
    again = run(root, tmp_path / "out.pt", "--memory", tier, *MEMORY)
    assert again.returncode == 0, again.stderr[-4000:]
    text = again.stdout + again.stderr
    assert f"(step {held.step}) from the memory tier of node 0" in text, text[-4000:]
    assert json.loads((tmp_path / "out.pt.json").read_text())["first_step"] == held.step
    assert same_weights(tmp_path / "out.pt", reference)
    assert durable_step(root) == 16  # the end of training is on the durable tier
    # Memory holds one save (and nothing of the restore) once training is done.
    parsed = [parse_held("last.ckpt", p.name) for p in tier.glob("*/node-0/last.ckpt.*")]
    assert len({found[0] for found in parsed if found is not None}) <= 2, parsed


@pytest.mark.slow
def test_a_damaged_shard_in_memory_falls_back_to_the_durable_tier_exactly(
    tmp_path: Path, reference: Path
) -> None:
    tier = tmp_path / "shm"
    root, held = killed(tmp_path, tier)
    (shard,) = tier.glob(f"*/node-0/{held_name('last.ckpt', held.gen, '__1_0.distcp')}")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    again = run(root, tmp_path / "out.pt", "--memory", tier, *MEMORY)
    assert again.returncode == 0, again.stderr[-4000:]
    text = again.stdout + again.stderr
    assert "could not be assembled on every node" in text and "does not match the set" in text, text[-4000:]
    assert "from the memory tier" not in text
    assert json.loads((tmp_path / "out.pt.json").read_text())["first_step"] == 3
    assert same_weights(tmp_path / "out.pt", reference)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 kB tmpfs of its own (root only: ``mount``): smaller than one rank's shard (about 20 kB)."""
    with mounted_tmpfs(tmp_path / "shm", "16k") as folder:
        yield folder


@pytest.mark.slow
def test_a_node_whose_tmpfs_cannot_take_a_shard_saves_to_the_durable_tier_exactly(
    tiny_tmpfs: Path, tmp_path: Path, reference: Path
) -> None:
    root = tmp_path / "runs"
    done = run(root, tmp_path / "out.pt", "--memory", tiny_tmpfs, *MEMORY)
    assert done.returncode == 0, done.stderr[-4000:]
    text = done.stdout + done.stderr
    assert 1 <= text.count("is full (") <= 2, text[-4000:]  # once per rank, not once per save
    assert "this rank's shard needs about" in text
    assert not list(tiny_tmpfs.rglob("last.ckpt.*"))  # nothing committed in memory
    assert same_weights(tmp_path / "out.pt", reference)
    assert durable_step(root) == 16


# -- pick: pure ----------------------------------------------------------------------------------------


def entry(checksum: str, step: int) -> Entry:
    return Entry(10, checksum.ljust(16, "0"), step, 0, float(step))


def shard_set(gen: str, step: int, files: dict[str, str]) -> ShardSet:
    return ShardSet(gen, step, 0, float(step), 2, {n: entry(c, step) for n, c in files.items()})


def copies(node: int, origin: int, held: ShardSet, only: tuple[str, ...] | None = None) -> list[Copy]:
    return [
        Copy(node, f"node{node}", origin, held_name("last.ckpt", held.gen, n), e)
        for n, e in held.files.items()
        if only is None or n in only
    ]


def test_pick_takes_the_newest_complete_set_and_never_one_older_than_the_durable_save() -> None:
    old = shard_set("6-1-aa", 6, {"__0_0.distcp": "a", "__1_0.distcp": "b", ".metadata": "c"})
    new = shard_set("9-2-bb", 9, {"__0_0.distcp": "d", "__1_0.distcp": "e", ".metadata": "f"})
    held = [*copies(0, 0, old), *copies(1, 1, old), *copies(0, 0, new, ("__0_0.distcp", ".metadata"))]
    # The newest set lacks rank 1's shard everywhere: the older complete one.
    chosen = pick([old, new, old], held, "last.ckpt", 3, node=1)
    assert chosen is not None and chosen[0] == old
    assert [c.node for c in chosen[1]["__0_0.distcp"]] == [1, 0]  # this node's copy first
    # Its shard held by node 1: the newest set.
    held += copies(1, 1, new, ("__1_0.distcp",))
    chosen = pick([old, new], held, "last.ckpt", 3, node=0)
    assert chosen is not None and chosen[0] == new
    # A copy with other bytes does not count.
    wrong = [Copy(1, "node1", 1, held_name("last.ckpt", new.gen, "__1_0.distcp"), entry("z", 9))]
    chosen = pick([new], [*copies(0, 0, new, ("__0_0.distcp", ".metadata")), *wrong], "last.ckpt", 3, 0)
    assert chosen is None
    # Never older than the durable save; the same step is the same save.
    assert pick([old, new], held, "last.ckpt", 12, node=0) is None
    assert pick([new], held, "last.ckpt", 9, node=0) is not None
    assert pick([], held, "last.ckpt", None, node=0) is None


def test_held_names_round_trip() -> None:
    assert parse_held("last.ckpt", held_name("last.ckpt", "9-2-bb", ".metadata")) == ("9-2-bb", ".metadata")
    assert parse_held("last.ckpt", held_name("last.ckpt", "9-2-bb", "__0_0.distcp")) == (
        "9-2-bb",
        "__0_0.distcp",
    )
    assert parse_held("last.ckpt", "last.ckpt.9-2-bb.meta.pt.manifest.json") is None
    assert parse_held("last.ckpt", "last.ckpt") is None
    assert parse_held("last.ckpt", "other.9-2-bb.meta.pt") is None
