"""Checkpoint manifests: what a checkpoint file must be to count as verified.

``last.ckpt`` has a sidecar ``last.ckpt.manifest.json`` with one to three entries (size, XXH3-64
checksum, step, epoch, time, versions, user metadata). The first entry is the newest save; the others are
the saves it replaced. A save replaces the manifest *before* the data file, so whichever data file
a kill leaves behind matches one of the entries, and a data file that matches none is torn or
corrupt.

Standard library and ``xxhash`` only: the writer process imports this module without torch or
lightning. XXH3 hashes at memory speed (about 10 GB/s here, CRC-32 manages 3), so verifying a
checkpoint costs little next to loading it.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

MANIFEST_SUFFIX = ".manifest.json"
FORMAT = "lightning-resume/checkpoint-manifest"
VERSION = 1
ALGORITHM = "xxh3_64"
MAX_ENTRIES = 3
CHUNK = 1 << 30  # one call per GiB: a hash running beside a load rarely waits for the GIL
PIECE = 2 << 20  # bytes hashed and written at a time by ChecksumWriter


@dataclass(frozen=True)
class Entry:
    """One saved version of a checkpoint file.

    Args:
        size: File size in bytes.
        checksum: XXH3-64 of the whole file, 16 hex digits.
        global_step: ``checkpoint["global_step"]`` when it was saved, if any.
        epoch: ``checkpoint["epoch"]`` when it was saved, if any.
        saved_at: Wall-clock time of the save (seconds since the epoch).
        versions: Library versions of the process that saved it.
        metadata: User metadata (JSON values).
    """

    size: int
    checksum: str
    global_step: int | None = None
    epoch: int | None = None
    saved_at: float = 0.0
    versions: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def same_data(self, other: Entry) -> bool:
        """Whether both entries describe the same bytes."""
        return self.size == other.size and self.checksum == other.checksum

    def with_metadata(self, metadata: Mapping[str, Any]) -> Entry:
        """A copy with ``metadata`` instead of the current user metadata."""
        return replace(self, metadata=dict(check_metadata(metadata)))

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "algorithm": ALGORITHM,
            "checksum": self.checksum,
            "global_step": self.global_step,
            "epoch": self.epoch,
            "saved_at": self.saved_at,
            "versions": dict(self.versions),
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        """Parse one entry; raises ``ValueError`` for anything that is not a valid entry."""
        try:
            if data.get("algorithm", ALGORITHM) != ALGORITHM:
                raise ValueError(f"unknown checksum algorithm {data.get('algorithm')!r}")
            checksum = data["checksum"]
            if not isinstance(checksum, str) or not checksum:
                raise ValueError(f"checksum {checksum!r} is not a hex string")
            saved_at = data.get("saved_at", 0.0)
            number = isinstance(saved_at, (int, float)) and not isinstance(saved_at, bool)
            if not number or not math.isfinite(saved_at):
                raise ValueError(f"saved_at {saved_at!r} is not a finite time")
            return cls(
                size=whole_number(data["size"], "size"),
                checksum=checksum,
                global_step=whole_number(data.get("global_step"), "global_step", optional=True),
                epoch=whole_number(data.get("epoch"), "epoch", optional=True),
                saved_at=float(saved_at),
                versions=dict(data.get("versions", {})),
                metadata=dict(data.get("metadata", {})),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"invalid manifest entry: {e}") from e


def whole_number(value: Any, name: str, optional: bool = False) -> Any:
    """``value`` if it is a non-negative whole number (JSON integer) that fits in 63 bits."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ValueError(f"{name} {value!r} is not a whole number from 0 to 2**63")
    return value


class Checksum:
    """A running XXH3-64 and byte count.

    Raises:
        ImportError: ``xxhash`` is not installed.
    """

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
    """A write-only, non-seekable file wrapper that checksums every byte passing through.

    Non-seekable on purpose: ``zipfile`` then streams (data descriptors, no seeking back), so the
    checksum covers the file exactly as written.
    """

    def __init__(self, raw: Writable) -> None:
        self.raw = raw
        self.checksum = Checksum()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        # In pieces: each is still in the CPU cache when it is copied out, and a large write (a whole
        # storage from torch.save) reaches the file while it is being hashed, not after.
        for offset in range(0, view.nbytes, PIECE):
            piece = view[offset : offset + PIECE]
            self.checksum.update(piece)
            self.raw.write(piece)
        return view.nbytes

    def tell(self) -> int:
        return self.checksum.size

    def seekable(self) -> bool:
        return False

    def seek(self, *args: Any) -> int:
        raise OSError("ChecksumWriter is not seekable")

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        """Leave the underlying file open: its owner fsyncs and closes it."""


def manifest_path(path: str | Path) -> Path:
    """``last.ckpt`` -> ``last.ckpt.manifest.json``."""
    path = Path(path)
    return path.with_name(path.name + MANIFEST_SUFFIX)


def is_manifest(name: str) -> bool:
    return name.endswith(MANIFEST_SUFFIX)


def data_name(manifest_name: str) -> str:
    """``last.ckpt.manifest.json`` -> ``last.ckpt``."""
    return manifest_name[: -len(MANIFEST_SUFFIX)]


def encode(entries: Sequence[Entry]) -> str:
    return json.dumps(
        {"format": FORMAT, "version": VERSION, "entries": [e.to_json() for e in entries]},
        indent=1,
        sort_keys=True,
    )


def decode(text: str | bytes) -> list[Entry]:
    """Parse a manifest; raises ``ValueError`` when it is not one this version can read."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a lightning-resume checkpoint manifest")
    if not isinstance(data.get("version"), int) or data["version"] > VERSION:
        raise ValueError(f"manifest version {data.get('version')!r} is newer than this library reads")
    entries = data.get("entries")
    if not isinstance(entries, list) or not entries:
        raise ValueError("manifest lists no entries")
    return [Entry.from_json(e) for e in entries]


def parse(raw: bytes | None) -> list[Entry] | None:
    """Entries of a raw manifest: ``None`` without one, ``[]`` for one that cannot be read."""
    if raw is None:
        return None
    try:
        return decode(raw)
    except ValueError:
        return []


def read_entries(path: str | Path) -> list[Entry] | None:
    """The entries of ``path``'s manifest; ``None`` without a manifest, ``[]`` for an unreadable one."""
    try:
        return parse(manifest_path(path).read_bytes())
    except FileNotFoundError:
        return None


def next_entries(new: Entry, current: Iterable[Entry]) -> list[Entry]:
    """The manifest written before ``new`` replaces a data file matching one of ``current``."""
    kept = [e for e in current if not e.same_data(new)]
    return [new, *kept[: MAX_ENTRIES - 1]]


def sized(entries: Iterable[Entry], size: int) -> list[Entry]:
    """Entries a file of ``size`` bytes could match (a cheap check; the checksum decides)."""
    return [e for e in entries if e.size == size]


def match(entries: Iterable[Entry], size: int, checksum: str) -> Entry | None:
    """The entry describing a file with this size and checksum, if any."""
    for entry in entries:
        if entry.size == size and entry.checksum == checksum:
            return entry
    return None


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


def describe(entry: Entry) -> str:
    """``global step 40, epoch 3, saved 2024-05-01 12:00:00`` for messages."""
    parts = []
    if entry.global_step is not None:
        parts.append(f"global step {entry.global_step}")
    if entry.epoch is not None:
        parts.append(f"epoch {entry.epoch}")
    if entry.saved_at and math.isfinite(entry.saved_at):
        parts.append("saved " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.saved_at)))
    return ", ".join(parts) or "no step recorded"
