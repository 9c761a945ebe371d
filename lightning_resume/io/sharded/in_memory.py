"""Sharded saves in the memory tier: each rank's files committed in its node's memory, with a set naming them
all, copied to the peers; a restart assembles the newest complete set not older than the durable one."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lightning_resume._collectives import any_rank, barrier, gather_objects, gather_objects_on
from lightning_resume._storage.atomic import TEMP_PREFIX
from lightning_resume._storage.commit import commit, commit_file, remove
from lightning_resume._storage.kinds import FILE, new_save_dir
from lightning_resume._storage.manifest import MANIFEST_SUFFIX, Entry, checksum_file, next_entries
from lightning_resume._storage.store import LocalStore
from lightning_resume._storage.writer import Aside
from lightning_resume._warnings import warn
from lightning_resume.io.memory import wire
from lightning_resume.io.memory.node_memory import NodeMemory, tensor_bytes
from lightning_resume.io.memory.placement import Copy, holders, origin_of, peers
from lightning_resume.io.restore import MEMORY, Restore
from lightning_resume.io.sharded import parts

log = logging.getLogger(__name__)

SET_FILE = "lr-set.json"  #: the file of a generation naming all its files (DCP writes no such file)
RESTORE_FOLDER = "restore"  #: in the run's folder of a node's tier: the directory a restart loads
_SCRATCH = ".lr-dcp-"
_SLACK = 1.05


def held_name(pointer: str, gen: str, file: str) -> str:
    """The name of the file ``file`` of the save ``gen`` in the tier: ``last.ckpt.9-3-1f2e.__0_0.distcp``."""
    return f"{pointer}.{gen}.{file}"


def parse_held(pointer: str, name: str) -> tuple[str, str] | None:
    """``(gen, file)`` of a name :func:`held_name` made, else ``None``."""
    if not name.startswith(f"{pointer}.") or name.endswith(MANIFEST_SUFFIX):
        return None
    gen, dot, file = name[len(pointer) + 1 :].partition(".")
    return (gen, file) if gen and dot and file else None


@dataclass(frozen=True)
class ShardSet:
    """One sharded save in the memory tier: every file of it (DCP's name) with its entry."""

    gen: str  # the save's generation: its files are named after it
    step: int
    epoch: int
    saved_at: float
    world_size: int
    files: Mapping[str, Entry]

    @property
    def size(self) -> int:
        return sum(e.size for e in self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "files": {n: e.to_json() for n, e in sorted(self.files.items())}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardSet:
        return cls(**{**data, "files": {n: Entry.from_json(e) for n, e in data["files"].items()}})


def pick(
    sets: Sequence[ShardSet], copies: Sequence[Copy], pointer: str, durable_step: int | None, node: int
) -> tuple[ShardSet, dict[str, list[Copy]]] | None:
    """The newest set not older than the durable save whose every file some node holds, with each's copies."""
    floor = -1 if durable_step is None else durable_step
    unique = {_identity(s): s for s in sets}  # nodes holding the same set report it each
    for candidate in sorted(unique.values(), key=lambda s: (s.step, s.saved_at), reverse=True):
        if candidate.step < floor:
            return None
        sources: dict[str, list[Copy]] = {}
        for name, entry in candidate.files.items():
            held = held_name(pointer, candidate.gen, name)
            found = [c for c in copies if c.name == held and c.entry.same_data(entry)]
            if not found:
                break
            sources[name] = sorted(found, key=lambda c: (c.node != node, c.node))
        else:
            return candidate, sources
    return None


def _identity(shard_set: ShardSet) -> tuple[Any, ...]:
    files = tuple(sorted((n, e.size, e.checksum) for n, e in shard_set.files.items()))
    return (shard_set.gen, shard_set.step, shard_set.saved_at, files)


@dataclass
class _MemorySave:
    """The newest save, while only the memory tier holds it: this rank's files and the manifest fields."""

    gen: str
    mine: dict[str, Entry]
    fields: dict[str, Any]
    required: tuple[str, ...]


class ShardedMemory:
    """One process's saves of a sharded ``pointer`` into the memory tier, their replicas, durable copies."""

    def __init__(self, memory: NodeMemory, pointer: Path) -> None:
        self.memory = memory
        self.pointer = pointer
        self._saves = 0
        self._newest: _MemorySave | None = None

    # -- the training thread: every rank, at the same point -----------------------------------------

    def plan(self, trainer: pl.Trainer, state: dict[str, Any]) -> Path | None:
        """A scratch folder of this node's memory for this save, or ``None``: it goes to the durable tier."""
        count, self._saves = self._saves, self._saves + 1
        usable = self.memory.serves(self.pointer.parent)
        folder = self.memory.folder(self.memory.node)
        if usable and int(getattr(trainer.strategy, "local_rank", 0)) == 0:
            # No save or copy is in flight on any node (the saver agreed on that): one process per node
            # keeps the newest save's files and drops the rest.
            prune(self.memory, self.pointer.name, self.memory.sharded_generation)
        if count % self.memory.config.durable_every == 0:
            self._newest = None
            return None
        room = None
        if usable:
            folder.mkdir(parents=True, exist_ok=True)
            needed, free = tensor_bytes(state) * _SLACK, shutil.disk_usage(folder).free
            if free < needed:
                room = f"{free / 1e6:.2f} MB free, this rank's shard needs about {needed / 1e6:.2f} MB"
        ready = gather_objects(trainer.strategy, (usable and room is None, secrets.token_hex(4)))
        if not all(ok for ok, _ in ready):
            if room is not None:
                self.memory.full(room)
            self._newest = None
            return None
        self.memory.has_room()
        scratch = folder / f"{_SCRATCH}{trainer.global_step}-{count}-{ready[0][1]}"
        scratch.mkdir(parents=True, exist_ok=True)
        return scratch

    def to_durable(
        self, trainer: pl.Trainer, agree: Callable[..., str | None], commit_durable: Callable[..., None]
    ) -> None:
        """Copy the newest save durable if only memory holds it (every rank), through the saver's steps."""
        newest, self._newest = self._newest, None
        if newest is None:
            return
        started = time.monotonic()
        chosen = new_save_dir(self.pointer.parent) if trainer.is_global_zero else None
        save_dir = Path(agree(trainer, None, None, chosen) or "")
        folder = self.memory.folder(self.memory.node)
        names = {n: held_name(self.pointer.name, newest.gen, n) for n in newest.mine}
        error = parts.attempt(lambda: _copy_out(folder, names, newest.mine, save_dir, trainer.global_rank))
        agree(trainer, error, save_dir)
        if trainer.is_global_zero:
            fields = newest.fields
            error = parts.attempt(
                lambda: commit_durable(save_dir, trainer.world_size, newest.required, fields, started)
            )
        agree(trainer, error, save_dir)
        log.info("the newest memory save (step %s) is on the durable tier", newest.fields.get("global_step"))

    # -- the writer thread: every rank -------------------------------------------------------------

    def commit(
        self,
        group: Any,
        scratch: Path,
        rank: int,
        meta: bytes | None,
        fields: dict[str, Any],
        required: tuple[str, ...],
        failed: BaseException | None,
    ) -> int:
        """Commit what DCP wrote into ``scratch`` with every rank, send it to the peers; return its bytes."""
        mine: dict[str, Entry] = {}
        gen = scratch.name.removeprefix(_SCRATCH)
        error = None if failed is None else f"rank {rank}: {type(failed).__name__}: {failed}"
        if error is None:
            try:
                mine = self._commit_files(scratch, gen, rank, meta, fields)
            except OSError as e:
                error = f"rank {rank}: {e}"
        everyone = gather_objects_on(group, (error, mine))
        problems = [e for e, _ in everyone if e]
        shutil.rmtree(scratch, ignore_errors=True)
        if problems:
            raise RuntimeError(
                f"Saving the sharded checkpoint into the memory tier failed ({' | '.join(problems)}). "
                f"{self.pointer.name} still names the previous save."
            )
        files = {name: entry for _, held in everyone for name, entry in held.items()}
        shard_set = ShardSet(gen, fields["global_step"], fields["epoch"], time.time(), len(everyone), files)
        folder = self.memory.folder(self.memory.node)
        sends = [(held_name(self.pointer.name, gen, n), e) for n, e in mine.items()]
        self.memory.sharded_generation = gen  # every rank's files are committed: the next plan keeps these
        if rank == 0:
            aside = Aside(folder / held_name(self.pointer.name, gen, SET_FILE), direct=False)
            step, set_at = shard_set.step, shard_set.saved_at
            with aside as out:
                out.write(json.dumps(shard_set.to_json()).encode())
            entry = commit_file(aside, {"global_step": step, "epoch": shard_set.epoch, "saved_at": set_at})[0]
            sends.append((held_name(self.pointer.name, gen, SET_FILE), entry))  # last: a peer's set follows
        self._newest = _MemorySave(gen, mine, fields, required)
        for peer in peers(self.memory.node, self.memory.nodes, self.memory.config.replicas):
            for name, entry in sends:
                with open(folder / name, "rb") as source:
                    self.memory.send(peer, name, source, entry)
        return sum(e.size for e in mine.values())

    def _commit_files(
        self, scratch: Path, gen: str, rank: int, meta: bytes | None, fields: dict[str, Any]
    ) -> dict[str, Entry]:
        if meta is not None:
            (scratch / parts.LIGHTNING_META).write_bytes(meta)
        names = parts.dcp_files_of(scratch, rank)
        if rank == 0:
            names += [n for n in parts.DCP_REQUIRED if (scratch / n).is_file()]
        folder = self.memory.folder(self.memory.node)
        store = LocalStore(folder)
        mine = {}
        for name in names:
            entry = Entry(*checksum_file(scratch / name), fields["global_step"], fields["epoch"], time.time())
            target = folder / held_name(self.pointer.name, gen, name)
            commit(FILE, scratch / name, target, next_entries(entry, FILE.held(store, target.name)))
            mine[name] = entry
        return mine


# -- restore ---------------------------------------------------------------------------------------


def restore(memory: NodeMemory, trainer: pl.Trainer, pointer: Path) -> tuple[ShardSet, Path, Restore] | None:
    """At a restart (every rank): the newest save the nodes hold, assembled; ``None``: the durable tier."""
    if not memory.attached:
        return None
    strategy = trainer.strategy
    started, wall = time.monotonic(), time.time()
    local_zero = int(getattr(strategy, "local_rank", 0)) == 0
    usable = memory.serves(pointer.parent)
    held = _held(memory, pointer.name) if usable and local_zero else ([], [])
    durable = parts.read_manifest(pointer) if trainer.is_global_zero else None
    everyone = gather_objects(strategy, (usable, held, None if durable is None else durable.global_step))
    if not all(ok for ok, _, _ in everyone):
        return None
    sets = [ShardSet.from_json(s) for _, (_, found), _ in everyone for s in found]
    copies = [Copy.from_json(c) for _, (found, _), _ in everyone for c in found]
    chosen = pick(sets, copies, pointer.name, everyone[0][2], memory.node)
    if chosen is None:
        return None
    shard_set, sources = chosen
    memory.sharded_generation = shard_set.gen  # kept in memory until a newer save is
    target = memory.run_folder / RESTORE_FOLDER
    problem, fetched = None, {}
    if local_zero:
        try:
            fetched = _assemble(memory, shard_set, sources, target)
        except OSError as e:
            problem = str(e)
    if any_rank(strategy, problem is not None):
        used = sorted({c.node for found in sources.values() for c in found})
        warn(
            f"MemoryTier: the sharded save of step {shard_set.step} (held by nodes {used}) could not be "
            f"assembled on every node ({problem or 'another node failed'}). Loading the durable tier "
            "instead.",
            all_ranks=problem is not None,
        )
        return None
    source = max(fetched, key=lambda n: fetched[n]) if fetched else memory.node
    seconds = time.monotonic() - started
    record = Restore(
        MEMORY, str(pointer), shard_set.size, seconds, source, memory.host_of(source), shard_set.step, wall
    )
    barrier(strategy, "lightning_resume sharded memory restore")
    return shard_set, target, record


def prune(memory: NodeMemory, pointer: str, keep: str | None) -> None:
    """Drop this node's sharded files but those of the save ``keep``, and leftovers (one process per node)."""
    own = memory.folder(memory.node)
    for leftover in (
        *own.glob(f"{_SCRATCH}*"),
        *own.glob(f"{TEMP_PREFIX}*"),
        memory.run_folder / RESTORE_FOLDER,
    ):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    for path in memory.run_folder.glob(f"node-*/{pointer}.*"):
        parsed = parse_held(pointer, path.name)
        if parsed is not None and parsed[0] != keep:
            remove(LocalStore(path.parent), FILE, path.name)


def _held(memory: NodeMemory, pointer: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The committed files of sharded saves this node holds (as ``Copy`` JSON) and the sets (JSON)."""
    copies, sets = [], []
    for path in sorted(memory.run_folder.glob(f"node-*/{pointer}.*")):
        parsed = parse_held(pointer, path.name)
        entry = wire.committed_copy(path) if parsed is not None else None
        if parsed is None or entry is None:
            continue
        if parsed[1] == SET_FILE:
            with contextlib.suppress(OSError, ValueError, KeyError):
                sets.append(json.loads(path.read_bytes()))
        copies.append(Copy(memory.node, wire.host_name(), origin_of(path), path.name, entry).to_json())
    return copies, sets


def _assemble(
    memory: NodeMemory, shard_set: ShardSet, sources: Mapping[str, Sequence[Copy]], target: Path
) -> dict[int, int]:
    """Every file of ``shard_set`` in ``target`` (this node's memory); return the bytes taken per node."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    taken: dict[int, int] = {}
    for name, entry in shard_set.files.items():
        problems = []
        for copy in sources[name]:
            try:
                if copy.node == memory.node:
                    local = memory.folder(copy.origin) / copy.name
                    if checksum_file(local) != (entry.size, entry.checksum):
                        raise OSError(f"{local} does not match the set")
                    os.link(local, target / name)
                else:
                    memory.fetch(copy.node, copy.origin, copy.name, entry, target / name)
            except OSError as e:
                problems.append(f"node {copy.node}: {e}")
                continue
            taken[copy.node] = taken.get(copy.node, 0) + entry.size
            break
        else:
            raise OSError(f"{name}: {'; '.join(problems)} (held by {holders(sources[name])})")
    return taken


def _copy_out(
    folder: Path, names: Mapping[str, str], mine: Mapping[str, Entry], save_dir: Path, rank: int
) -> None:
    """This rank's files of a memory save (``names``: DCP's to held) into ``save_dir``, checked, recorded."""
    for name, held in names.items():
        shutil.copyfile(folder / held, save_dir / name)
    entries = parts.hash_files(save_dir, mine)
    for got in entries:
        expected = mine[got.name]
        if (got.size, got.checksum) != (expected.size, expected.checksum):
            raise OSError(f"{save_dir / got.name} differs from its memory copy: not committed")
    parts.write_part(save_dir, rank, entries)
