"""The two kinds of checkpoint, and only what differs between them.

A **file** (``last.ckpt``, what ``CheckpointIO`` writes) and a **directory** (a sharded checkpoint,
``.lr-ckpt-<step>-<hex>/`` named by the symlink ``last.ckpt``) are committed, verified, listed,
pruned, cleaned up and mirrored by the same functions (``catalog``, ``commit``, ``cleanup``,
``mirror``). A kind tells them:

- how its manifest lists content: :meth:`Kind.manifest_name`, :meth:`Kind.decode` (the versions it
  describes, newest first) and :meth:`Kind.files` (the files of one version). A file's manifest keeps
  up to three versions of the one file; a directory's lists its files;
- which checkpoints a listing holds (:meth:`Kind.names`) and the retention family of a name
  (:meth:`Kind.family`: digits ignored for files; every directory of a folder is one family);
- how it is staged and swapped in: locally, a file is written to a temporary sibling and renamed onto
  its name (:meth:`Kind.swap`); a directory is written into ``.lr-save-<pid>-<hex>``, renamed to its
  committed name, and the ``last.ckpt`` link is swapped. Remotely, a file is uploaded to a temporary
  key and moved onto its name; a directory's files go to their final keys and a pointer object
  ``last.ckpt.pointer.json`` names it (object stores have no links).

Pure standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from lightning_resume._storage.atomic import (
    TEMP_PREFIX,
    fsync_dir,
    replace_durably,
    temp_sibling,
    write_text_atomic,
)
from lightning_resume._storage.manifest import (
    MANIFEST_SUFFIX,
    DirectoryManifest,
    Entry,
    FileEntry,
    decode,
    encode,
    manifest_path,
    next_entries,
    sized,
)
from lightning_resume._storage.store import SAVE_PREFIX, UPLOAD_PREFIX, Store, put

#: A committed checkpoint directory: ``.lr-ckpt-<step, 8 digits>-<hex>``.
COMMITTED_PREFIX = ".lr-ckpt-"
MANIFEST_NAME = ".lr-manifest.json"
#: ``<url>/<pointer name><POINTER_SUFFIX>`` names the committed remote checkpoint directory.
POINTER_SUFFIX = ".pointer.json"
POINTER_FORMAT = "lightning-resume/directory-pointer"
_COMMITTED_NAME = re.compile(rf"^{re.escape(COMMITTED_PREFIX)}(\d+)-([0-9a-f]+)$")
_SAVE_NAME = re.compile(rf"^{re.escape(SAVE_PREFIX)}(\d+)-([0-9a-f]+)")
_NUMBER = re.compile(r"\d+")
_TOKEN_BYTES = 4

R = TypeVar("R", Entry, DirectoryManifest)


#: Called with the name of each step of a commit as it gets there (an observer for kill tests).
Step = Callable[[str], None]


class Kind(Protocol[R]):
    """What a checkpoint file and a checkpoint directory do differently (see the module docstring)."""

    @property
    def directory(self) -> bool:
        """``True`` for directories: verified as a directory, and an uncommitted one is a leftover."""
        ...

    def names(self, sizes: Mapping[str, int]) -> list[str]:
        """The checkpoints of this kind in a listing, committed or not."""
        ...

    def manifest_name(self, name: str) -> str:
        """Where the manifest of checkpoint ``name`` is, relative to its folder."""
        ...

    def decode(self, raw: bytes) -> list[R]:
        """The versions a manifest describes, newest first (raises ``ValueError``, ``NewerManifest``)."""
        ...

    def encode(self, records: Sequence[R]) -> str:
        """The manifest of ``records``."""
        ...

    def files(self, name: str, record: R) -> tuple[FileEntry, ...]:
        """The files (relative to the folder) that make up version ``record`` of checkpoint ``name``."""
        ...

    def family(self, name: str) -> str:
        """The retention family of ``name``: ``keep`` counts per family."""
        ...

    def slot(self, name: str) -> str:
        """What a newer save of checkpoint ``name`` replaces: a file's name, a directory's link."""
        ...

    def removal(self, name: str) -> list[tuple[str, bool]]:
        """``(name, is a folder)`` to delete in order: first what would let a half-deleted one count."""
        ...

    def stage(self, target: Path) -> Path:
        """A fresh, empty place beside ``target`` to write a new version into (it names this process)."""
        ...

    def write_manifest(self, staged: Path, target: Path, records: Sequence[R]) -> None:
        """Put the manifest of ``records`` in place, durably, before the swap."""
        ...

    def swap(self, staged: Path, target: Path, records: Sequence[R], name: str | None, on_step: Step) -> Path:
        """Make ``staged`` the checkpoint ``target`` names, atomically; return where it is now."""
        ...

    def next_records(self, new: R, current: Sequence[R]) -> list[R]:
        """The manifest that makes ``new`` current, where ``current`` describes what is there now."""
        ...

    def held(self, store: Store, name: str) -> list[R]:
        """The versions that may describe what ``store`` holds as ``name`` now (a new manifest keeps
        them): a file's entries of its size; a directory's manifest when the pointer object names it."""
        ...

    def upload_key(self, name: str) -> str:
        """Where a file of the checkpoint is uploaded to before the remote swap."""
        ...

    def remote_swap(self, store: Store, name: str, record: R, staged: Mapping[str, str]) -> None:
        """Make the uploaded files (``staged``: final name -> upload key) the remote checkpoint."""
        ...


@dataclass(frozen=True)
class FileKind:
    """A checkpoint file with the sibling manifest ``<name>.manifest.json``."""

    directory: bool = False

    def names(self, sizes: Mapping[str, int]) -> list[str]:
        return sorted(
            n[: -len(MANIFEST_SUFFIX)] for n in sizes if "/" not in n and n.endswith(MANIFEST_SUFFIX)
        )

    def manifest_name(self, name: str) -> str:
        return name + MANIFEST_SUFFIX

    def decode(self, raw: bytes) -> list[Entry]:
        return decode(raw)

    def encode(self, records: Sequence[Entry]) -> str:
        return encode(records)

    def files(self, name: str, record: Entry) -> tuple[FileEntry, ...]:
        return (FileEntry(name, record.size, record.checksum),)

    def family(self, name: str) -> str:
        """Digits replaced by ``#``: ``epoch=3-step=400.ckpt`` -> ``epoch=#-step=#.ckpt``."""
        return _NUMBER.sub("#", name)

    def slot(self, name: str) -> str:
        return name

    def removal(self, name: str) -> list[tuple[str, bool]]:
        # Data first: a data file without its manifest would load as an unverified plain file.
        return [(name, False), (self.manifest_name(name), False)]

    def stage(self, target: Path) -> Path:
        fd, staged = temp_sibling(target)
        os.close(fd)
        return staged

    def write_manifest(self, staged: Path, target: Path, records: Sequence[Entry]) -> None:
        # Beside the data file, replacing the one that describes it: whichever data file a kill
        # leaves at ``target`` matches an entry.
        write_text_atomic(manifest_path(target), encode(records))

    def swap(
        self, staged: Path, target: Path, records: Sequence[Entry], name: str | None, on_step: Step
    ) -> Path:
        replace_durably(staged, target)
        return target

    def held(self, store: Store, name: str) -> list[Entry]:
        size = store.sizes().get(name)
        raw = store.read(self.manifest_name(name))
        if size is None or raw is None:
            return []
        try:
            return sized(decode(raw), size)
        except ValueError:
            return []

    def upload_key(self, name: str) -> str:
        return f"{UPLOAD_PREFIX}{uuid.uuid4().hex}-{name}"

    def remote_swap(self, store: Store, name: str, record: Entry, staged: Mapping[str, str]) -> None:
        store.move(staged[name], name)

    def next_records(self, new: Entry, current: Sequence[Entry]) -> list[Entry]:
        return next_entries(new, current)


@dataclass(frozen=True)
class DirectoryKind:
    """Checkpoint directories ``.lr-ckpt-*`` named by the link ``pointer`` (``last.ckpt``)."""

    pointer: str = "last.ckpt"
    directory: bool = True

    def names(self, sizes: Mapping[str, int]) -> list[str]:
        found = {n.split("/", 1)[0] for n in sizes if "/" in n}
        return sorted(n for n in found if _COMMITTED_NAME.match(n))

    def manifest_name(self, name: str) -> str:
        return f"{name}/{MANIFEST_NAME}"

    def decode(self, raw: bytes) -> list[DirectoryManifest]:
        return [DirectoryManifest.from_json(raw)]

    def encode(self, records: Sequence[DirectoryManifest]) -> str:
        return records[0].to_json()

    def files(self, name: str, record: DirectoryManifest) -> tuple[FileEntry, ...]:
        return tuple(FileEntry(f"{name}/{f.name}", f.size, f.checksum) for f in record.files)

    def family(self, name: str) -> str:
        return COMMITTED_PREFIX

    def slot(self, name: str) -> str:
        return self.pointer

    def removal(self, name: str) -> list[tuple[str, bool]]:
        # The manifest first: a directory without it never counts.
        return [(self.manifest_name(name), False), (name, True)]

    def stage(self, target: Path) -> Path:
        return new_save_dir(target.parent)

    def write_manifest(self, staged: Path, target: Path, records: Sequence[DirectoryManifest]) -> None:
        write_text_atomic(staged / MANIFEST_NAME, records[0].to_json())  # last: the files are in place

    def swap(
        self,
        staged: Path,
        target: Path,
        records: Sequence[DirectoryManifest],
        name: str | None,
        on_step: Step,
    ) -> Path:
        final = target.parent / (name or final_name(staged, records[0].global_step))
        os.replace(staged, final)
        fsync_dir(target.parent)
        on_step("before_swap")
        swap_pointer(target, final.name)
        return final

    def held(self, store: Store, name: str) -> list[DirectoryManifest]:
        if self.remote_target(store) != name:
            return []
        raw = store.read(self.manifest_name(name))
        try:
            return self.decode(raw) if raw is not None else []
        except ValueError:
            return []

    def upload_key(self, name: str) -> str:
        return name  # nothing names the directory before the pointer does

    def remote_swap(
        self, store: Store, name: str, record: DirectoryManifest, staged: Mapping[str, str]
    ) -> None:
        pointer = {"format": POINTER_FORMAT, "directory": name, "global_step": record.global_step}
        put(store, self.pointer + POINTER_SUFFIX, json.dumps(pointer))

    def next_records(
        self, new: DirectoryManifest, current: Sequence[DirectoryManifest]
    ) -> list[DirectoryManifest]:
        return [new]

    def remote_target(self, store: Store) -> str | None:
        """The remote directory the pointer object names, or ``None``."""
        try:
            data = json.loads(store.read(self.pointer + POINTER_SUFFIX) or b"null")
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("format") != POINTER_FORMAT:
            return None
        name = data.get("directory")
        return name if isinstance(name, str) and _COMMITTED_NAME.match(name) else None


FILE = FileKind()
DIRECTORY = DirectoryKind()


# -- local names of directories, and the link -----------------------------------------------------


def new_save_dir(parent: Path, create: bool = True) -> Path:
    """A fresh directory name beside the pointer (created unless ``create=False``); it names this process."""
    parent.mkdir(parents=True, exist_ok=True)
    while True:
        path = parent / f"{SAVE_PREFIX}{os.getpid()}-{secrets.token_hex(_TOKEN_BYTES)}"
        if not create:
            if not os.path.lexists(path):
                return path
            continue
        with contextlib.suppress(FileExistsError):
            path.mkdir()
            return path


def final_name(save_dir: Path, step: int | None) -> str:
    """``.lr-ckpt-<step>-<token>`` for a save directory: sorts by step; its token kept, so every rank can
    tell the name."""
    found = _SAVE_NAME.match(save_dir.name)
    token = found.group(2) if found else secrets.token_hex(_TOKEN_BYTES)
    return f"{COMMITTED_PREFIX}{max(step or 0, 0):08d}-{token}"


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
