"""Checkpoint manifests: a file's ``<name>.manifest.json`` lists up to three :class:`Entry`, newest first; a
directory's ``.lr-manifest.json`` is a :class:`DirectoryManifest`. XXH3 checksums (10 GB/s; CRC-32: 3)."""

from __future__ import annotations

import json
import math
import mmap
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

MANIFEST_SUFFIX = ".manifest.json"
FORMAT = "lightning-resume/checkpoint-manifest"
DIRECTORY_FORMAT = "lightning-resume/directory-manifest"
VERSION = 1
ALGORITHM = "xxh3_64"
MAX_ENTRIES = 3
CHUNK = 1 << 30  # one call per GiB: a hash running beside a load rarely waits for the GIL
PIECE = 2 << 20  # bytes hashed and written at a time by ChecksumWriter


class NewerManifest(ValueError):
    """A manifest of a format ``version`` newer than this library reads, written by ``writer``."""

    def __init__(self, version: int, writer: str | None) -> None:
        super().__init__(f"manifest version {version!r} is newer than this library reads")
        self.version = version
        self.writer = writer


def read_header(text: str | bytes, format: str) -> dict[str, Any]:
    """The JSON object of a manifest of ``format``, its header checked (``NewerManifest``, ``ValueError``)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from e
    if not isinstance(data, dict) or data.get("format") != format:
        raise ValueError(f"not a {format} manifest")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"manifest version {version!r} is not a number")
    if version > VERSION:
        raise NewerManifest(version, _writer_version(data))
    if data.get("algorithm", ALGORITHM) != ALGORITHM:
        raise ValueError(f"unknown checksum algorithm {data.get('algorithm')!r}")
    return data


def _writer_version(data: dict[str, Any]) -> str | None:
    """``versions.lightning_resume`` of a manifest (a directory's, or a file's newest entry)."""
    holder: Any = data["entries"][0] if isinstance(data.get("entries"), list) and data["entries"] else data
    versions = holder.get("versions") if isinstance(holder, dict) else None
    found = versions.get("lightning_resume") if isinstance(versions, dict) else None
    return found if isinstance(found, str) else None


def whole_number(value: Any, name: str, optional: bool = False) -> Any:
    """``value`` if it is a non-negative whole number (JSON integer) that fits in 63 bits."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ValueError(f"{name} {value!r} is not a whole number from 0 to 2**63")
    return value


def _checksum(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"checksum {value!r} is not a hex string")
    return value


def _common(data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields every manifest record has (step, epoch, save time, versions, metadata), checked."""
    saved_at = data.get("saved_at", 0.0)
    if isinstance(saved_at, bool) or not isinstance(saved_at, (int, float)) or not math.isfinite(saved_at):
        raise ValueError(f"saved_at {saved_at!r} is not a finite time")
    return {
        "global_step": whole_number(data.get("global_step"), "global_step", optional=True),
        "epoch": whole_number(data.get("epoch"), "epoch", optional=True),
        "saved_at": float(saved_at),
        "versions": dict(data.get("versions") or {}),
        "metadata": dict(data.get("metadata") or {}),
    }


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its name (relative, ``/``-separated), size and XXH3-64 checksum."""

    name: str
    size: int
    checksum: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileEntry:
        return cls(_name(data["name"]), whole_number(data["size"], "size"), _checksum(data["checksum"]))


@dataclass(frozen=True)
class Entry:
    """One saved version of a checkpoint file: size, checksum, step, epoch, save time, versions, metadata."""

    size: int
    checksum: str
    global_step: int | None = None
    epoch: int | None = None
    saved_at: float = 0.0
    versions: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def same_data(self, other: Entry) -> bool:
        return self.size == other.size and self.checksum == other.checksum

    def with_metadata(self, metadata: Mapping[str, Any]) -> Entry:
        return replace(self, metadata=dict(check_metadata(metadata)))

    def to_json(self) -> dict[str, Any]:
        return {"algorithm": ALGORITHM, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        """Parse one entry; raises ``ValueError`` for anything that is not a valid entry."""
        try:
            if data.get("algorithm", ALGORITHM) != ALGORITHM:
                raise ValueError(f"unknown checksum algorithm {data.get('algorithm')!r}")
            return cls(whole_number(data["size"], "size"), _checksum(data["checksum"]), **_common(data))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"invalid manifest entry: {e}") from e


def encode(entries: Sequence[Entry]) -> str:
    """The manifest of a checkpoint file."""
    data = {"format": FORMAT, "version": VERSION, "entries": [e.to_json() for e in entries]}
    return json.dumps(data, indent=1, sort_keys=True)


def decode(text: str | bytes) -> list[Entry]:
    """The entries of a checkpoint file's manifest, newest first (raises as :func:`read_header`)."""
    entries = read_header(text, FORMAT).get("entries")
    if not isinstance(entries, list) or not entries:
        raise ValueError("manifest lists no entries")
    return [Entry.from_json(e) for e in entries]


@dataclass(frozen=True)
class DirectoryManifest:
    """A committed checkpoint directory: its files, the fields of an :class:`Entry`, its ranks and layout."""

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
        return sum(f.size for f in self.files)

    def same_data(self, other: DirectoryManifest) -> bool:
        return self.files == other.files

    def to_json(self) -> str:
        data = {"format": DIRECTORY_FORMAT, "version": VERSION, "algorithm": ALGORITHM, **asdict(self)}
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> DirectoryManifest:
        """Parse a manifest (raises as :func:`read_header`, and for a required file it does not list)."""
        data = read_header(text, DIRECTORY_FORMAT)
        try:
            files = tuple(FileEntry.from_json(f) for f in data["files"])
            required = tuple(_name(n) for n in data.get("required") or ())
            unlisted = sorted(set(required) - {f.name for f in files})
            if unlisted:
                raise ValueError(f"{', '.join(unlisted)} is required but not part of the checkpoint")
            world_size = max(whole_number(data.get("world_size", 1), "world_size"), 1)
            layout = dict(data.get("layout") or {})
            return cls(files, world_size=world_size, layout=layout, required=required, **_common(data))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"invalid directory manifest: {e}") from e


R = TypeVar("R", Entry, DirectoryManifest)  #: what a manifest describes: a file's entry, a directory's


def _name(value: Any) -> str:
    """A file name of a directory manifest: relative, inside the directory."""
    if not isinstance(value, str) or not value or value.startswith("/") or ".." in value.split("/"):
        raise ValueError(f"file name {value!r} is not a path inside the checkpoint directory")
    return value


class Checksum:
    """A running XXH3-64 and byte count (``ImportError`` with the install hint without ``xxhash``)."""

    def __init__(self) -> None:
        try:
            import xxhash
        except ImportError as e:
            raise ImportError('lightning-resume hashes checkpoints with xxhash: pip install "xxhash"') from e
        self._hash = xxhash.xxh3_64()
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        # xxhash releases the GIL, so this runs beside the training threads.
        self._hash.update(data)
        self.size += memoryview(data).nbytes

    def hexdigest(self) -> str:
        return str(self._hash.hexdigest())


class Writable(Protocol):
    """What :class:`ChecksumWriter` writes to: a binary file or a ``DirectFile``."""

    def write(self, data: bytes | bytearray | memoryview, /) -> int: ...
    def flush(self) -> None: ...


class ChecksumWriter:
    """A write-only file that checksums every byte; not seekable, so that ``zipfile`` streams."""

    def __init__(self, raw: Writable) -> None:
        self.raw = raw
        self.checksum = Checksum()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        # In pieces: each is still in the CPU cache when copied out, and reaches the file while hashing.
        for offset in range(0, view.nbytes, PIECE):
            piece = view[offset : offset + PIECE]
            self.checksum.update(piece)
            self.raw.write(piece)
        return view.nbytes

    def tell(self) -> int:
        return self.checksum.size

    def seekable(self) -> bool:
        return False

    def flush(self) -> None:
        self.raw.flush()


def manifest_path(path: str | Path) -> Path:
    """``last.ckpt`` -> ``last.ckpt.manifest.json``."""
    path = Path(path)
    return path.with_name(path.name + MANIFEST_SUFFIX)


def read_entries(path: str | Path) -> list[Entry] | None:
    """The entries of ``path``'s manifest; ``None`` without a manifest, ``[]`` for an unreadable one."""
    try:
        raw = manifest_path(path).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return decode(raw)
    except ValueError:
        return []


def next_entries(new: R, current: Iterable[R]) -> list[R]:
    """The manifest written before ``new`` replaces what matches one of ``current``."""
    kept = [new]
    kept += [entry for entry in current if not entry.same_data(new)]
    return kept[:MAX_ENTRIES]


def sized(entries: Iterable[Entry], size: int) -> list[Entry]:
    """Entries a file of ``size`` bytes could match (a cheap check; the checksum decides)."""
    return [e for e in entries if e.size == size]


def checksum_file(path: str | Path, chunk: int = CHUNK) -> tuple[int, str]:
    """``(size, checksum)`` of a file, hashed through a memory map (no copy) ``chunk`` bytes at a time."""
    checksum = Checksum()
    with open(path, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return 0, checksum.hexdigest()
        with mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ) as mapped, memoryview(mapped) as view:
            for offset in range(0, size, chunk):
                checksum.update(view[offset : offset + chunk])
    return checksum.size, checksum.hexdigest()


def check_metadata(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return ``metadata`` if it can be stored in a manifest, else raise ``TypeError``."""
    if not isinstance(metadata, Mapping):
        raise TypeError(f"Checkpoint metadata must be a mapping of str to JSON values, got {metadata!r}.")
    try:
        text = json.dumps(metadata, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"Checkpoint metadata {metadata!r} is not JSON-serialisable ({e}): use str, int, float, bool, "
            "None, lists and dicts of those."
        ) from e
    if any(not isinstance(key, str) for key in metadata):
        raise TypeError(f"Checkpoint metadata keys must be str, got {list(metadata)!r}.")
    return json.loads(text)  # a deep copy: later changes to the caller's dict do not leak in


def describe(record: Entry | DirectoryManifest) -> str:
    """``global step 40, epoch 3, saved 2024-05-01 12:00:00`` for messages."""
    parts = []
    if record.global_step is not None:
        parts.append(f"global step {record.global_step}")
    if record.epoch is not None:
        parts.append(f"epoch {record.epoch}")
    if record.saved_at and math.isfinite(record.saved_at):
        parts.append("saved " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.saved_at)))
    return ", ".join(parts) or "no step recorded"
