"""What differs between a checkpoint **file** (versions in ``last.ckpt.manifest.json``) and a **directory**
(``.lr-ckpt-<step>-<hex>/``, named by the link ``last.ckpt``); the rest of ``_storage`` serves both."""

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
from typing import Protocol

from lightning_resume._storage import manifest
from lightning_resume._storage.atomic import TEMP_PREFIX, fsync_dir, replace_durably, temp_sibling
from lightning_resume._storage.manifest import MANIFEST_SUFFIX, DirectoryManifest, Entry, FileEntry, R
from lightning_resume._storage.store import SAVE_PREFIX, UPLOAD_PREFIX, Store, put

COMMITTED_PREFIX = ".lr-ckpt-"  #: a committed checkpoint directory: ``.lr-ckpt-<step, 8 digits>-<hex>``
MANIFEST_NAME = ".lr-manifest.json"
POINTER_SUFFIX = ".pointer.json"  #: ``<url>/last.ckpt.pointer.json`` names the remote directory
POINTER_FORMAT = "lightning-resume/directory-pointer"
_COMMITTED_NAME = re.compile(rf"^{re.escape(COMMITTED_PREFIX)}(\d+)-([0-9a-f]+)$")
_SAVE_NAME = re.compile(rf"^{re.escape(SAVE_PREFIX)}(\d+)-([0-9a-f]+)")
_NUMBER = re.compile(r"\d+")
_TOKEN_BYTES = 4

#: Called with the name of each step of a commit as it gets there (an observer for kill tests).
Step = Callable[[str], None]


def unobserved(step: str) -> None:
    """The default :data:`Step` observer: none."""


class Kind(Protocol[R]):
    """What a checkpoint file and a checkpoint directory do differently. ``slot(name)``: what a newer save
    of ``name`` replaces; ``removal(name)``: ``(name, is a folder)`` to delete, in order."""

    @property
    def directory(self) -> bool: ...
    def names(self, sizes: Mapping[str, int]) -> list[str]: ...
    def manifest_name(self, name: str) -> str: ...
    def decode(self, raw: bytes) -> list[R]: ...
    def encode(self, records: Sequence[R]) -> str: ...
    def files(self, name: str, record: R) -> tuple[FileEntry, ...]: ...
    def family(self, name: str) -> str: ...
    def slot(self, name: str) -> str: ...
    def removal(self, name: str) -> list[tuple[str, bool]]: ...
    def stage(self, target: Path) -> Path: ...
    def manifest_at(self, staged: Path, target: Path) -> Path: ...
    def swap(self, staged: Path, target: Path, record: R, name: str | None, on_step: Step) -> Path: ...
    def held(self, store: Store, name: str) -> list[R]: ...
    def upload_key(self, name: str) -> str: ...
    def remote_swap(self, store: Store, name: str, record: R, staged: Mapping[str, str]) -> None: ...


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
        return manifest.decode(raw)

    def encode(self, records: Sequence[Entry]) -> str:
        return manifest.encode(records)

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

    def manifest_at(self, staged: Path, target: Path) -> Path:
        # Replaced before the data file: whichever data file a kill leaves matches an entry.
        return manifest.manifest_path(target)

    def swap(self, staged: Path, target: Path, record: Entry, name: str | None, on_step: Step) -> Path:
        replace_durably(staged, target)
        return target

    def held(self, store: Store, name: str) -> list[Entry]:
        size = store.size(name)
        return manifest.sized(read_versions(store, self, name), size) if size is not None else []

    def upload_key(self, name: str) -> str:
        return f"{UPLOAD_PREFIX}{uuid.uuid4().hex}-{name}"

    def remote_swap(self, store: Store, name: str, record: Entry, staged: Mapping[str, str]) -> None:
        store.move(staged[name], name)


@dataclass(frozen=True)
class DirectoryKind:
    """Checkpoint directories ``.lr-ckpt-*`` named by the link ``pointer`` (``last.ckpt``)."""

    pointer: str = "last.ckpt"
    directory: bool = True

    def names(self, sizes: Mapping[str, int]) -> list[str]:
        tops = {n.split("/", 1)[0] for n in sizes if "/" in n}
        return sorted(top for top in tops if _COMMITTED_NAME.match(top))

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
        return [(self.manifest_name(name), False), (name, True)]  # without its manifest it never counts

    def stage(self, target: Path) -> Path:
        return new_save_dir(target.parent)

    def manifest_at(self, staged: Path, target: Path) -> Path:
        return staged / MANIFEST_NAME  # last, the files being in place

    def swap(
        self, staged: Path, target: Path, record: DirectoryManifest, name: str | None, on_step: Step
    ) -> Path:
        final = target.parent / (name or final_name(staged, record.global_step))
        os.replace(staged, final)
        fsync_dir(target.parent)
        on_step("before_swap")
        swap_pointer(target, final.name)
        return final

    def held(self, store: Store, name: str) -> list[DirectoryManifest]:
        return read_versions(store, self, name) if self.remote_target(store) == name else []

    def upload_key(self, name: str) -> str:
        return name  # nothing names the directory before the pointer does

    def remote_swap(
        self, store: Store, name: str, record: DirectoryManifest, staged: Mapping[str, str]
    ) -> None:
        pointer = {"format": POINTER_FORMAT, "directory": name, "global_step": record.global_step}
        put(store, self.pointer + POINTER_SUFFIX, json.dumps(pointer))

    def remote_target(self, store: Store) -> str | None:
        with contextlib.suppress(ValueError):
            data = json.loads(store.read(self.pointer + POINTER_SUFFIX) or b"null")
            ours = isinstance(data, dict) and data.get("format") == POINTER_FORMAT
            name = data.get("directory") if ours else None
            return name if isinstance(name, str) and _COMMITTED_NAME.match(name) else None
        return None


FILE = FileKind()
DIRECTORY = DirectoryKind()


def read_versions(store: Store, kind: Kind[R], name: str) -> list[R]:
    """The versions the manifest of ``name`` lists, newest first; none when it is missing or unreadable."""
    raw = store.read(kind.manifest_name(name))
    with contextlib.suppress(ValueError):
        return kind.decode(raw) if raw is not None else []
    return []


def new_save_dir(parent: Path, create: bool = True) -> Path:
    """A fresh directory name beside the pointer (created unless ``create=False``); it names this process."""
    parent.mkdir(parents=True, exist_ok=True)
    while True:
        path = parent / f"{SAVE_PREFIX}{os.getpid()}-{secrets.token_hex(_TOKEN_BYTES)}"
        if not create and not os.path.lexists(path):
            return path
        if create:
            with contextlib.suppress(FileExistsError):
                path.mkdir()
                return path


def final_name(save_dir: Path, step: int | None) -> str:
    """``.lr-ckpt-<step>-<token>`` for a save directory (its token kept: every rank can tell the name)."""
    found = _SAVE_NAME.match(save_dir.name)
    token = found.group(2) if found else secrets.token_hex(_TOKEN_BYTES)
    return f"{COMMITTED_PREFIX}{max(step or 0, 0):08d}-{token}"


def resolve_pointer(pointer: Path) -> Path | None:
    """What ``pointer`` names: a link's (even dangling) target, a real directory itself, or ``None``."""
    if pointer.is_symlink():
        return pointer.parent / os.readlink(pointer)
    if pointer.is_dir():
        return pointer
    return None


def swap_pointer(pointer: Path, target_name: str) -> None:
    """Point ``pointer`` at its sibling ``target_name`` in one atomic rename, then fsync the folder; a
    real directory there (plain Lightning's) is moved aside and deleted after. ``OSError``: no symlinks."""
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
