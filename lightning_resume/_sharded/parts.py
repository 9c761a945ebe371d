"""A sharded save: what each rank wrote, the manifest assembled from it, the commit.

Every rank writes into one fresh ``.lr-save-<pid>-<hex>`` directory, fsyncs and hashes its files and
records them in ``.lr-part-<rank>.json``; then one process hashes the rest, builds the manifest and
commits (``_storage.commit``, then retention). The ranks meet in the part files, not in a collective.
Pure standard library (and ``xxhash``): no torch, no Lightning.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import TEMP_PREFIX, fsync_dir, fsync_file, write_json_atomic
from lightning_resume._storage.catalog import verify
from lightning_resume._storage.cleanup import clean_stale
from lightning_resume._storage.commit import commit, prune
from lightning_resume._storage.kinds import DIRECTORY, MANIFEST_NAME, DirectoryKind, Step, resolve_pointer
from lightning_resume._storage.manifest import DirectoryManifest, FileEntry, check_metadata, checksum_file
from lightning_resume._storage.store import LocalStore

PART_PREFIX = ".lr-part-"
#: DCP's global metadata and Lightning's non-tensor state: what a DCP checkpoint cannot load without.
DCP_METADATA = ".metadata"
LIGHTNING_META = "meta.pt"
DCP_REQUIRED = (DCP_METADATA, LIGHTNING_META)


def _nothing(step: str) -> None:
    """The default ``on_step`` observer: none."""


def list_files(directory: Path) -> list[str]:
    """Every regular file under ``directory`` (relative, ``/``-separated, sorted), our own files left out."""
    found = []
    for folder, dirs, files in os.walk(directory):
        dirs.sort()
        base = Path(folder).relative_to(directory)
        for name in files:
            if name == MANIFEST_NAME or name.startswith((PART_PREFIX, TEMP_PREFIX)):
                continue
            if not os.path.isfile(os.path.join(folder, name)) or os.path.islink(os.path.join(folder, name)):
                continue
            found.append((base / name).as_posix())
    return sorted(found)


def dcp_files_of(directory: Path, rank: int) -> list[str]:
    """The files DCP's ``FileSystemWriter`` wrote for ``rank``: ``__<rank>_<n>.distcp``."""
    prefix = f"__{rank}_"
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix) and n.endswith(".distcp"))


def hash_files(directory: Path, names: Iterable[str], fsync: bool = True) -> list[FileEntry]:
    """Fsync (unless ``fsync=False``) and hash ``names`` under ``directory``."""
    entries = []
    for name in sorted(names):
        if fsync:
            fsync_file(directory / name)
        size, checksum = checksum_file(directory / name)
        entries.append(FileEntry(name, size, checksum))
    return entries


def part_path(directory: Path, rank: int) -> Path:
    return directory / f"{PART_PREFIX}{rank}.json"


def write_part(directory: Path, rank: int, entries: Sequence[FileEntry], error: str | None = None) -> None:
    """Record, durably, the files ``rank`` wrote and hashed, or why it could not."""
    write_json_atomic(part_path(directory, rank), {"files": [asdict(e) for e in entries], "error": error})


def read_parts(directory: Path, world_size: int) -> dict[str, FileEntry]:
    """Every rank's recorded files by name.

    Raises:
        FileNotFoundError: some ranks recorded nothing yet (the message names them).
        RuntimeError: a rank recorded that it failed.
    """
    found: dict[str, FileEntry] = {}
    missing = []
    for rank in range(world_size):
        try:
            part = json.loads(part_path(directory, rank).read_text())
        except FileNotFoundError:
            missing.append(rank)
            continue
        if part.get("error"):
            raise RuntimeError(f"rank {rank} could not record its files: {part['error']}")
        for item in part["files"]:
            entry = FileEntry(str(item["name"]), int(item["size"]), str(item["checksum"]))
            found[entry.name] = entry
    if missing:
        raise FileNotFoundError(f"rank(s) {missing} recorded no files in {str(directory)!r} yet")
    return found


def parts_complete(directory: Path, world_size: int) -> bool:
    """Whether every rank recorded its files.

    Raises:
        RuntimeError: a rank recorded that it failed.
    """
    try:
        read_parts(directory, world_size)
    except FileNotFoundError:
        return False
    return True


def build_manifest(
    directory: Path, world_size: int, required: Sequence[str] = (), **fields: Any
) -> DirectoryManifest:
    """The manifest of a save directory every rank recorded its part of (``fields``: its other fields).

    Files no rank claimed (``.metadata``, ``meta.pt``, any file of an unknown layout) are fsynced and
    hashed here; every folder inside is fsynced.

    Raises:
        FileNotFoundError: a rank recorded no part, or a ``required`` file is missing.
    """
    claimed = read_parts(directory, world_size)
    names = list_files(directory)
    missing = [n for n in required if n not in names]
    if missing:
        raise FileNotFoundError(f"{str(directory)!r} has no {', '.join(missing)}: the save is incomplete")
    entries = {e.name: e for e in hash_files(directory, [n for n in names if n not in claimed])}
    entries.update({n: claimed[n] for n in names if n in claimed})
    for folder, _, _ in os.walk(directory):
        fsync_dir(folder)
    metadata = dict(check_metadata(fields.pop("metadata", {}) or {}))
    files = tuple(entries[n] for n in sorted(entries))
    return DirectoryManifest(
        files, world_size=world_size, required=tuple(required), metadata=metadata, **fields
    )


def read_manifest(directory: Path) -> DirectoryManifest | None:
    """The manifest of a checkpoint directory (or a link to one), ``None`` when it has no readable one."""
    return verify(directory, DIRECTORY, checksums=False).manifest


def commit_directory(
    save_dir: Path, pointer: Path, manifest: DirectoryManifest, keep: int, on_step: Step = _nothing
) -> Path:
    """Commit ``save_dir`` as the directory ``pointer`` (``last.ckpt``) names, then prune to ``keep``.

    The part files go; ``_storage.commit.commit`` writes the manifest, renames the directory and swaps
    the pointer, calling ``on_step`` at each step; retention never deletes the new directory.

    Raises:
        OSError: from the filesystem; the pointer then still names the previous directory.
    """
    for part in save_dir.glob(f"{PART_PREFIX}*"):
        part.unlink()
    kind = DirectoryKind(pointer.name)
    final = commit(kind, save_dir, pointer, [manifest], on_step=on_step)
    prune(LocalStore(pointer.parent), kind, keep, final.name, on_step)
    return final


def clean_up(pointer: Path, keep: int, restart: bool = False) -> list[str]:
    """Delete the leftovers of interrupted saves beside ``pointer`` and what retention names; return them."""
    target = resolve_pointer(pointer)
    removed = clean_stale(pointer.parent, restart)
    kind = DirectoryKind(pointer.name)
    return removed + prune(LocalStore(pointer.parent), kind, keep, target.name if target else None)
