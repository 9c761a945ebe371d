"""Where checkpoints are kept: a local folder or an fsspec URL behind one protocol, names relative and
``/``-separated. Writes through it are not durable (``commit`` makes local checkpoints so)."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import IO, Any, Protocol

from lightning_resume._storage.atomic import TEMP_PREFIX, fsync_dir

UPLOAD_PREFIX = ".lr-upload-"  #: temporary keys of uploads in flight (remotely: no process ids)
SAVE_PREFIX = ".lr-save-"  #: a save directory in flight (``.lr-save-<pid>-<hex>``), never listed
INSTALL_HINT = 'pip install "lightning-resume[remote]"'


class Store(Protocol):
    """A folder of checkpoints; ``sizes(deep=True)`` lists subfolders too, never temporary files."""

    def sizes(self, deep: bool = False) -> dict[str, int]: ...
    def size(self, name: str) -> int | None: ...
    def read(self, name: str) -> bytes | None: ...
    def open(self, name: str, mode: str = "rb") -> IO[bytes]: ...
    def move(self, source: str, target: str) -> None: ...
    def remove(self, name: str, tree: bool = False) -> None: ...


def _temporary(name: str) -> bool:
    return name.startswith((TEMP_PREFIX, UPLOAD_PREFIX, SAVE_PREFIX))


@dataclass(frozen=True)
class LocalStore:
    """A local checkpoint folder; links at its top are followed (``save_last="link"``), not inside."""

    root: Path

    def sizes(self, deep: bool = False) -> dict[str, int]:
        found: dict[str, int] = {}
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return found
        for entry in entries:
            if _temporary(entry.name):
                continue
            try:
                if entry.is_file():
                    found[entry.name] = entry.stat().st_size
                elif deep and entry.is_dir(follow_symlinks=False):
                    # An empty folder is listed as ``<name>/``: a half-deleted directory is found.
                    inside = walk_files(Path(entry.path)).items()
                    found.update({f"{entry.name}/{n}": size for n, size in inside} or {f"{entry.name}/": 0})
            except FileNotFoundError:
                continue
        return found

    def size(self, name: str) -> int | None:
        try:
            return (self.root / name).stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def open(self, name: str, mode: str = "rb") -> IO[bytes]:
        if "w" in mode:
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        return open(self.root / name, mode)

    def move(self, source: str, target: str) -> None:
        os.replace(self.root / source, self.root / target)

    def remove(self, name: str, tree: bool = False) -> None:
        """Delete, then fsync the folder it was in: the removal is durable before the next step."""
        if tree:
            shutil.rmtree(self.root / name, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(self.root / name)
        fsync_dir((self.root / name).parent)


def walk_files(folder: Path) -> dict[str, int]:
    """Sizes of the regular files under ``folder`` (links not followed) by relative ``/``-separated name."""
    found = {}
    for parent, dirs, files in os.walk(folder):
        dirs.sort()
        base = Path(parent).relative_to(folder)
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                info = os.lstat(os.path.join(parent, name))
                if S_ISREG(info.st_mode):
                    found[(base / name).as_posix()] = info.st_size
    return found


class RemoteStore:
    """A folder at an fsspec URL (``ImportError`` with the install hint without fsspec or its backend)."""

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        self.url = url
        try:
            import fsspec
        except ImportError as e:
            raise ImportError(f"DurableCheckpointIO(mirror={url!r}) needs fsspec: {INSTALL_HINT}") from e
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **(options or {}))
        except ImportError as e:
            raise ImportError(
                f"DurableCheckpointIO(mirror={url!r}) needs the fsspec backend for it ({e}): {INSTALL_HINT}"
            ) from e
        except ValueError as e:
            raise ValueError(f"DurableCheckpointIO cannot mirror to {url!r}: {e}") from e
        self.root = str(root).rstrip("/")

    def key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def sizes(self, deep: bool = False) -> dict[str, int]:
        self.fs.invalidate_cache(self.root)
        try:
            listed = self.fs.find(self.root, detail=True) if deep else self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return {}
        found = listed if deep else {info["name"]: info for info in listed}
        sizes = {}
        for path, info in found.items():
            name = path.rstrip("/")[len(self.root) + 1 :]
            if name and info.get("type") != "directory" and not _temporary(name):
                sizes[name] = int(info.get("size") or 0)
        return sizes

    def size(self, name: str) -> int | None:
        self.fs.invalidate_cache(self.root)
        try:
            return int(self.fs.size(self.key(name)))
        except FileNotFoundError:
            return None

    def read(self, name: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(self.key(name)))
        except FileNotFoundError:
            return None

    def open(self, name: str, mode: str = "rb") -> IO[bytes]:
        if "w" in mode and "/" in name:
            with contextlib.suppress(OSError, NotImplementedError):  # object stores have no folders
                self.fs.makedirs(self.key(name).rsplit("/", 1)[0], exist_ok=True)
        return self.fs.open(self.key(name), mode)

    def move(self, source: str, target: str) -> None:
        self.fs.mv(self.key(source), self.key(target))

    def remove(self, name: str, tree: bool = False) -> None:
        with contextlib.suppress(FileNotFoundError):
            if tree:
                self.fs.rm(self.key(name), recursive=True)
            else:
                self.fs.rm_file(self.key(name))

    def clear_uploads(self) -> None:
        """Create the root and delete temporary keys of interrupted uploads (one writer per URL)."""
        with contextlib.suppress(OSError, NotImplementedError):
            self.fs.makedirs(self.root, exist_ok=True)
        self.fs.invalidate_cache(self.root)
        try:
            listed = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return
        for path in listed:
            if path.rstrip("/").rsplit("/", 1)[-1].startswith(UPLOAD_PREFIX):
                self.remove(path.rstrip("/")[len(self.root) + 1 :])


def put(store: Store, name: str, text: str) -> None:
    """Replace the small file ``name`` of ``store`` in one move: a reader sees the old or the new one."""
    temporary = f"{UPLOAD_PREFIX}{uuid.uuid4().hex}-{name.replace('/', '-')}"
    with store.open(temporary, "wb") as handle:
        handle.write(text.encode())
    store.move(temporary, name)
