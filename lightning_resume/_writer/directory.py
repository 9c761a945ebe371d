"""Checkpoint directories (sharded checkpoints): save aside, commit atomically, verify, clean up.

A sharded strategy writes a checkpoint as a directory of files (DCP's ``__<rank>_0.distcp`` shards
and ``.metadata``, Lightning's ``meta.pt``). Such a directory cannot be replaced atomically, so a
checkpoint folder holds committed directories and a pointer to the current one::

    last.ckpt -> .lr-ckpt-00000040-3f2a9c1e      relative symlink, swapped with os.replace: the commit
    .lr-ckpt-00000040-3f2a9c1e/                   committed: the files, then .lr-manifest.json (last)
    .lr-ckpt-00000030-77b01d2a/                   the previous one (the fallback), removed beyond keep
    .lr-save-<pid>-<hex>/                         a save in flight, or a leftover of a dead process

A save: every rank writes into a fresh ``.lr-save-<pid>-<hex>`` directory, fsyncs and hashes the
files it wrote and records them in ``.lr-part-<rank>.json``; once every rank has, one process fsyncs
and hashes the rest, writes the manifest (file names, sizes, XXH3 checksums, step, world size,
layout), renames the directory to its committed name, swaps the pointer (the commit) and deletes
committed directories beyond ``keep``. A kill at any instant leaves the pointer naming a complete,
fsynced directory: the old one or the new one. Verification compares every file with the manifest,
checksums included: shards from two different saves have the same sizes, only checksums tell them
apart.

Pure standard library (and ``xxhash``): no torch, no Lightning.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lightning_resume._writer.atomic import TEMP_PREFIX, fsync_dir, write_json_atomic, write_text_atomic
from lightning_resume._writer.catalog import Status, newest_first
from lightning_resume._writer.commit import process_alive
from lightning_resume._writer.manifest import ALGORITHM, check_metadata, checksum_file, whole_number

#: A save in flight: ``.lr-save-<pid>-<hex>`` (the pid tells leftovers of dead processes apart).
SAVE_PREFIX = ".lr-save-"
#: A committed checkpoint directory: ``.lr-ckpt-<step, 8 digits>-<hex>``.
COMMITTED_PREFIX = ".lr-ckpt-"
MANIFEST_NAME = ".lr-manifest.json"
PART_PREFIX = ".lr-part-"
FORMAT = "lightning-resume/directory-manifest"
VERSION = 1
#: DCP's global metadata and Lightning's non-tensor state: what a DCP checkpoint cannot load without.
DCP_METADATA = ".metadata"
LIGHTNING_META = "meta.pt"
DCP_REQUIRED = (DCP_METADATA, LIGHTNING_META)
#: The steps of :func:`commit`, in order, as passed to its ``on_step`` callback.
COMMIT_STEPS = ("before_manifest", "before_rename", "before_swap", "after_swap", "mid_delete")

_SAVE_NAME = re.compile(rf"^{re.escape(SAVE_PREFIX)}(\d+)-([0-9a-f]+)")
_COMMITTED_NAME = re.compile(rf"^{re.escape(COMMITTED_PREFIX)}(\d+)-([0-9a-f]+)$")
_LINK_NAME = re.compile(rf"^{re.escape(TEMP_PREFIX)}(\d+)-.*\.link$")
_TOKEN_BYTES = 4


def _nothing(step: str) -> None:
    """The default ``on_step`` callback: no observer."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint directory.

    Attributes:
        name: Its path relative to the directory, ``/``-separated.
        size: Its size in bytes.
        checksum: XXH3-64 of its content, 16 hex digits.
    """

    name: str
    size: int
    checksum: str


@dataclass(frozen=True)
class DirectoryManifest:
    """What a committed checkpoint directory holds (``.lr-manifest.json``, written last).

    Attributes:
        files: Every file of the directory but the manifest, with size and checksum.
        global_step: ``global_step`` of the checkpoint, if known.
        epoch: ``epoch`` of the checkpoint, if known.
        saved_at: Wall-clock time of the commit (seconds since the epoch); orders fallbacks.
        world_size: How many ranks wrote it.
        layout: How it was written: ``{"strategy": ..., "mesh": {...}, "writer": ...}``.
        required: Files a load cannot do without (``.metadata`` and ``meta.pt`` for DCP).
        versions: Library versions of the writing process.
        metadata: User metadata (JSON values).
    """

    files: tuple[FileEntry, ...]
    global_step: int | None = None
    epoch: int | None = None
    saved_at: float = 0.0
    world_size: int = 1
    layout: Mapping[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Total bytes of the files."""
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        data = {
            "format": FORMAT,
            "version": VERSION,
            "algorithm": ALGORITHM,
            "files": [asdict(f) for f in self.files],
            "global_step": self.global_step,
            "epoch": self.epoch,
            "saved_at": self.saved_at,
            "world_size": self.world_size,
            "layout": dict(self.layout),
            "required": list(self.required),
            "versions": dict(self.versions),
            "metadata": dict(self.metadata),
        }
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> DirectoryManifest:
        """Parse a manifest; raises ``ValueError`` for anything this version cannot read."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"not JSON: {e}") from e
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a lightning-resume directory manifest")
        if not isinstance(data.get("version"), int) or data["version"] > VERSION:
            raise ValueError(f"manifest version {data.get('version')!r} is newer than this library reads")
        if data.get("algorithm") != ALGORITHM:
            raise ValueError(f"unknown checksum algorithm {data.get('algorithm')!r}")
        try:
            files = tuple(
                FileEntry(_name(f["name"]), whole_number(f["size"], "size"), _checksum(f["checksum"]))
                for f in data["files"]
            )
            saved_at = data.get("saved_at", 0.0)
            if (
                isinstance(saved_at, bool)
                or not isinstance(saved_at, (int, float))
                or not math.isfinite(saved_at)
            ):
                raise ValueError(f"saved_at {saved_at!r} is not a finite time")
            world_size = whole_number(data.get("world_size", 1), "world_size")
            return cls(
                files=files,
                global_step=whole_number(data.get("global_step"), "global_step", optional=True),
                epoch=whole_number(data.get("epoch"), "epoch", optional=True),
                saved_at=float(saved_at),
                world_size=max(world_size, 1),
                layout=dict(data.get("layout") or {}),
                required=tuple(_name(n) for n in data.get("required") or ()),
                versions=dict(data.get("versions") or {}),
                metadata=dict(data.get("metadata") or {}),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"invalid directory manifest: {e}") from e


def _name(value: Any) -> str:
    """A file name of a manifest: relative, inside the directory."""
    if not isinstance(value, str) or not value or value.startswith("/") or ".." in value.split("/"):
        raise ValueError(f"file name {value!r} is not a path inside the checkpoint directory")
    return value


def _checksum(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"checksum {value!r} is not a hex string")
    return value


def write_manifest(directory: Path, manifest: DirectoryManifest) -> None:
    """Write ``.lr-manifest.json`` into ``directory`` atomically and durably."""
    write_text_atomic(directory / MANIFEST_NAME, manifest.to_json())


def read_manifest(directory: Path) -> DirectoryManifest | None:
    """The manifest of ``directory``: ``None`` without one; raises ``ValueError`` when unreadable."""
    try:
        text = (directory / MANIFEST_NAME).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return DirectoryManifest.from_json(text)


# -- writing a directory -----------------------------------------------------------------------


def new_save_dir(parent: Path, create: bool = True) -> Path:
    """A fresh directory name beside the pointer (created unless ``create=False``); it names this process."""
    parent.mkdir(parents=True, exist_ok=True)
    while True:
        path = parent / f"{SAVE_PREFIX}{os.getpid()}-{secrets.token_hex(_TOKEN_BYTES)}"
        if not create:
            if not os.path.lexists(path):
                return path
            continue
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def committed_name(step: int | None, token: str) -> str:
    """``.lr-ckpt-<step>-<token>``: sorts by step, unique by token."""
    return f"{COMMITTED_PREFIX}{max(step or 0, 0):08d}-{token}"


def final_name(save_dir: Path, step: int | None) -> str:
    """The committed name of a save directory (its random part kept, so every rank can tell it)."""
    found = _SAVE_NAME.match(save_dir.name)
    token = found.group(2) if found else secrets.token_hex(_TOKEN_BYTES)
    return committed_name(step, token)


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


def fsync_file(path: Path) -> None:
    """Flush one file's data (written by someone else, e.g. DCP or Lightning) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hash_files(directory: Path, names: Iterable[str], fsync: bool = True) -> list[FileEntry]:
    """Fsync (unless ``fsync=False``) and hash ``names`` under ``directory``."""
    entries = []
    for name in sorted(names):
        path = directory / name
        if fsync:
            fsync_file(path)
        size, checksum = checksum_file(path)
        entries.append(FileEntry(name, size, checksum))
    return entries


def write_bytes_durably(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to a new file ``path`` and fsync it (inside a save directory: no rename needed)."""
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def part_path(directory: Path, rank: int) -> Path:
    return directory / f"{PART_PREFIX}{rank}.json"


def write_part(directory: Path, rank: int, entries: Sequence[FileEntry], error: str | None = None) -> None:
    """Record, durably, the files ``rank`` wrote and hashed (or why it could not); the committing
    process reads them."""
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
    directory: Path,
    world_size: int,
    required: Sequence[str] = (),
    **fields: Any,
) -> DirectoryManifest:
    """Assemble the manifest of a fully written save directory (after every rank recorded its part).

    Files no rank claimed (``.metadata``, ``meta.pt``, any file of an unknown layout) are fsynced and
    hashed here; every folder inside is fsynced.

    Args:
        directory: The save directory.
        world_size: The ranks that wrote it (each recorded a part).
        required: Files that must be present.
        **fields: The other fields of :class:`DirectoryManifest`.

    Raises:
        FileNotFoundError: a rank recorded no part, or a required file is missing (nothing is committed).
    """
    claimed = read_parts(directory, world_size)
    names = list_files(directory)
    missing = [n for n in required if n not in names]
    if missing:
        raise FileNotFoundError(f"{str(directory)!r} has no {', '.join(missing)}: the save is incomplete")
    unclaimed = [n for n in names if n not in claimed]
    entries = {e.name: e for e in hash_files(directory, unclaimed)}
    for name in names:
        if name in claimed:
            entries[name] = claimed[name]
    for folder, _, _ in os.walk(directory):
        fsync_dir(folder)
    metadata = dict(check_metadata(fields.pop("metadata", {}) or {}))
    return DirectoryManifest(
        files=tuple(entries[n] for n in sorted(entries)),
        world_size=world_size,
        required=tuple(required),
        metadata=metadata,
        **fields,
    )


# -- the pointer and the commit ----------------------------------------------------------------


def resolve_pointer(pointer: Path) -> Path | None:
    """The directory ``pointer`` names: a symlink's target (even a dangling one), a real directory
    itself, otherwise ``None``."""
    if pointer.is_symlink():
        return pointer.parent / os.readlink(pointer)
    if pointer.is_dir():
        return pointer
    return None


def swap_pointer(pointer: Path, target_name: str) -> None:
    """Point ``pointer`` at its sibling ``target_name`` in one atomic rename, then fsync the folder.

    A real directory at ``pointer`` (a checkpoint written by plain Lightning) is moved aside and
    deleted once the pointer is in place.

    Raises:
        OSError: the filesystem has no symbolic links (the message says so).
    """
    parent = pointer.parent
    link = parent / f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(_TOKEN_BYTES)}-{pointer.name}.link"
    try:
        os.symlink(target_name, link)
    except OSError as e:
        raise OSError(
            e.errno,
            f"Cannot create a symbolic link in {str(parent)!r} ({e.strerror}): sharded checkpoints commit by "
            "swapping the last.ckpt link; put the checkpoint directory on a filesystem with symbolic links.",
            e.filename,
        ) from e
    aside = None
    if pointer.is_dir() and not pointer.is_symlink():
        aside = new_save_dir(parent, create=False)
        os.rename(pointer, aside)
    os.replace(link, pointer)
    fsync_dir(parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def commit(
    save_dir: Path,
    pointer: Path,
    manifest: DirectoryManifest,
    keep: int,
    on_step: Callable[[str], None] = _nothing,
) -> Path:
    """Commit a fully written ``save_dir`` as the directory ``pointer`` names; return its new path.

    The manifest is written last into the directory, which is renamed to its committed name; then
    the pointer is swapped (the commit) and committed directories beyond the newest ``keep`` are
    deleted (the pointer's target always stays).

    Args:
        save_dir: The save directory (every rank's files written and recorded).
        pointer: ``last.ckpt``.
        manifest: From :func:`build_manifest`.
        keep: Committed directories to keep (``>= 1``).
        on_step: Called with each name of :data:`COMMIT_STEPS` as the commit gets there (an observer).

    Raises:
        OSError: from the filesystem; the pointer then still names the previous directory.
    """
    parent = save_dir.parent
    for part in save_dir.glob(f"{PART_PREFIX}*"):
        part.unlink()
    on_step("before_manifest")
    write_manifest(save_dir, manifest)
    on_step("before_rename")
    final = parent / final_name(save_dir, manifest.global_step)
    os.rename(save_dir, final)
    fsync_dir(parent)
    on_step("before_swap")
    swap_pointer(pointer, final.name)
    on_step("after_swap")
    for name in beyond_keep(parent, pointer, keep):
        remove_directory(parent / name, on_step)
    return final


def remove_directory(path: Path, on_step: Callable[[str], None] = _nothing) -> None:
    """Delete a checkpoint directory, its manifest first: a half-deleted directory never counts."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        (path / MANIFEST_NAME).unlink()
        fsync_dir(path)
    on_step("mid_delete")
    shutil.rmtree(path, ignore_errors=True)
    fsync_dir(path.parent)


# -- which directories count -------------------------------------------------------------------


class DirectoryStorage(Protocol):
    """A folder of checkpoint directories (a local folder, a mirror URL)."""

    def directories(self) -> list[str]:
        """Names of the committed-looking directories (``.lr-ckpt-*``)."""
        ...

    def file_sizes(self, name: str) -> dict[str, int]:
        """Every file under directory ``name`` with its size (relative, ``/``-separated names)."""
        ...

    def read_manifest(self, name: str) -> bytes | None:
        """The raw manifest of directory ``name``, or ``None`` when it has none."""
        ...


@dataclass(frozen=True)
class LocalDirectories:
    """A local checkpoint folder."""

    folder: Path

    def directories(self) -> list[str]:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if _COMMITTED_NAME.match(n) and (self.folder / n).is_dir())

    def file_sizes(self, name: str) -> dict[str, int]:
        found = {}
        for relative in list_files(self.folder / name):
            with contextlib.suppress(FileNotFoundError):
                found[relative] = (self.folder / name / relative).stat().st_size
        return found

    def read_manifest(self, name: str) -> bytes | None:
        try:
            return (self.folder / name / MANIFEST_NAME).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None


def committed(storage: DirectoryStorage) -> dict[str, DirectoryManifest]:
    """Directories that pass the cheap check: a readable manifest, and every file with its size."""
    found = {}
    for name in storage.directories():
        raw = storage.read_manifest(name)
        if raw is None:
            continue
        try:
            manifest = DirectoryManifest.from_json(raw)
        except ValueError:
            continue
        sizes = storage.file_sizes(name)
        if all(sizes.get(f.name) == f.size for f in manifest.files) and set(manifest.required) <= set(sizes):
            found[name] = manifest
    return found


def candidates(pointer: Path) -> list[Path]:
    """Directories a restart may resume from, in fallback order: the pointer's target first, then
    the other committed directories, newest save first."""
    ordered = []
    target = resolve_pointer(pointer)
    if target is not None:
        ordered.append(target)
    for name in newest_first(committed(LocalDirectories(pointer.parent))):
        if target is None or name != target.name:
            ordered.append(pointer.parent / name)
    return ordered


def beyond_keep(parent: Path, pointer: Path, keep: int) -> list[str]:
    """Checkpoint directories retention deletes: all but the newest ``keep`` committed ones and the
    pointer's target (half-deleted and unreadable ones included).

    Raises:
        ValueError: for ``keep < 1``.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep!r}.")
    storage = LocalDirectories(parent)
    kept = set(newest_first(committed(storage))[:keep])
    target = resolve_pointer(pointer)
    if target is not None:
        kept.add(target.name)
    return [name for name in storage.directories() if name not in kept]


def stale(parent: Path, restart: bool = False) -> list[str]:
    """Leftovers of interrupted saves in ``parent``: save directories and temporary pointer links of
    dead processes (all of them when ``restart``: the earlier attempt may have run on another host)."""
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = _SAVE_NAME.match(name) or _LINK_NAME.match(name)
        if match and (restart or not process_alive(int(match.group(1)))):
            found.append(name)
    return sorted(found)


def clean_stale(parent: Path, pointer: Path, keep: int, restart: bool = False) -> list[str]:
    """Delete the :func:`stale` leftovers and the directories :func:`beyond_keep`; return their names."""
    removed = []
    for name in stale(parent, restart):
        path = parent / name
        if path.is_symlink() or path.is_file():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    for name in beyond_keep(parent, pointer, keep):
        remove_directory(parent / name)
        removed.append(name)
    if removed:
        fsync_dir(parent)
    return removed


# -- verification ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DirectoryVerdict:
    """The outcome of checking one checkpoint directory against its manifest.

    Attributes:
        status: What was found (``VERIFIED``, ``MISSING``, ``NO_MANIFEST``, ``UNVERIFIABLE``,
            ``INCOMPLETE``, ``TORN``, ``CORRUPT``).
        path: The directory.
        manifest: Its manifest, when readable.
        detail: Which file, and what is wrong with it.
    """

    status: Status
    path: Path
    manifest: DirectoryManifest | None = None
    detail: str = ""

    @property
    def reason(self) -> str:
        """``"torn (__0_0.distcp has 12 bytes, manifest says 57240)"``, for messages."""
        return self.status.value + (f" ({self.detail})" if self.detail else "")


def verify(path: Path, checksums: bool = True, share: tuple[int, int] = (0, 1)) -> DirectoryVerdict:
    """Check a checkpoint directory (or a pointer to one) against its manifest.

    Args:
        path: The directory; a symlink is followed.
        checksums: Compare checksums too (``False``: presence and sizes only, nothing read).
        share: ``(rank, world size)``: hash only the files whose index in the manifest is ``rank``
            modulo ``world size``, so that the ranks of a job verify one directory together. The
            checks without checksums are made in full by every call.
    """
    if not path.is_dir():
        if path.is_symlink():
            detail = f"{path.name} points at {os.readlink(path)}, which does not exist"
        else:
            detail = "not a directory" if path.exists() else "no such directory"
        return DirectoryVerdict(Status.MISSING, path, detail=detail)
    try:
        manifest = read_manifest(path)
    except ValueError as e:
        return DirectoryVerdict(Status.UNVERIFIABLE, path, detail=str(e))
    if manifest is None:
        return DirectoryVerdict(Status.NO_MANIFEST, path)
    listed = {f.name for f in manifest.files}
    for name in manifest.required:
        if name not in listed:
            return DirectoryVerdict(
                Status.INCOMPLETE, path, manifest, f"{name} is not part of the checkpoint"
            )
    for entry in manifest.files:
        try:
            size = (path / entry.name).stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return DirectoryVerdict(Status.INCOMPLETE, path, manifest, f"{entry.name} is missing")
        if size != entry.size:
            detail = f"{entry.name} has {size} bytes, manifest says {entry.size}"
            return DirectoryVerdict(Status.TORN, path, manifest, detail)
    if checksums:
        rank, world = share
        for index, entry in enumerate(manifest.files):
            if index % max(world, 1) != rank:
                continue
            size, checksum = checksum_file(path / entry.name)
            if (size, checksum) != (entry.size, entry.checksum):
                detail = f"{entry.name} does not match its checksum"
                return DirectoryVerdict(Status.CORRUPT, path, manifest, detail)
    return DirectoryVerdict(Status.VERIFIED, path, manifest)
