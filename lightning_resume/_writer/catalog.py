"""Which checkpoints in a folder count, and in which order a failed load falls back to them.

One rule for every place that asks (the plugin's load, the mirror's restore, ``lightning-resume
inspect``), over a small :class:`Storage` protocol that a local directory and a remote mirror both
implement:

- a checkpoint is **committed** when its manifest has an entry of the file's size (the cheap check;
  loading compares the checksum too);
- a checkpoint is **verified** when its size and checksum match an entry (:func:`check_file`);
- a load that finds its file torn or corrupt falls back to the other committed checkpoints,
  **newest save first** (:func:`newest_first`), and takes the first that verifies.

Pure standard library (and ``xxhash``): the writer process imports this module.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import Protocol

from lightning_resume._writer.atomic import TEMP_PREFIX
from lightning_resume._writer.manifest import (
    Entry,
    checksum_file,
    data_name,
    is_manifest,
    manifest_path,
    match,
    parse,
    read_entries,
    sized,
)

#: The fallback rule as the docs state it (``docs/src/how_resume_works.md``; a test compares them).
FALLBACK_RULE = (
    "A checkpoint that does not verify falls back to the other committed checkpoints of its folder, "
    "newest save first; the first that verifies is loaded."
)


class Dated(Protocol):
    """Anything with a save time: a file's manifest entry, a directory's manifest."""

    @property
    def saved_at(self) -> float: ...


class Storage(Protocol):
    """A flat folder of checkpoints and their manifests (a local directory, a mirror URL)."""

    def sizes(self) -> dict[str, int]:
        """Every regular file in the folder with its size, temporary files left out."""
        ...

    def read_manifest(self, name: str) -> bytes | None:
        """The raw manifest of checkpoint ``name``, or ``None`` when it has none."""
        ...


@dataclass(frozen=True)
class LocalStorage:
    """A local checkpoint directory."""

    directory: Path

    def sizes(self) -> dict[str, int]:
        found: dict[str, int] = {}
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return found
        for entry in entries:
            if entry.name.startswith(TEMP_PREFIX):
                continue
            try:
                if entry.is_file():
                    found[entry.name] = entry.stat().st_size
            except FileNotFoundError:
                continue
        return found

    def read_manifest(self, name: str) -> bytes | None:
        try:
            return manifest_path(self.directory / name).read_bytes()
        except FileNotFoundError:
            return None


def committed(storage: Storage) -> dict[str, Entry]:
    """Checkpoints that pass the cheap check, each with the newest entry of its size."""
    sizes = storage.sizes()
    found: dict[str, Entry] = {}
    for name in sizes:
        if not is_manifest(name) or data_name(name) not in sizes:
            continue
        checkpoint = data_name(name)
        candidates = sized(parse(storage.read_manifest(checkpoint)) or [], sizes[checkpoint])
        if candidates:
            found[checkpoint] = candidates[0]
    return found


def scan(directory: str | Path) -> dict[str, Entry]:
    """:func:`committed` for a local directory."""
    return committed(LocalStorage(Path(directory)))


def newest_first(checkpoints: Mapping[str, Dated], exclude: Iterable[str] = ()) -> list[str]:
    """Checkpoint names in fallback order: newest save first, then by name (files and directories).

    Example::

        for name in newest_first(scan(folder), exclude=["last.ckpt"]):
            ...  # try to load folder / name
    """
    skipped = set(exclude)
    ordered = sorted(
        ((entry.saved_at, name) for name, entry in checkpoints.items() if name not in skipped),
        key=lambda item: (-item[0], item[1]),
    )
    return [name for _, name in ordered]


class Status(enum.Enum):
    """What checking a checkpoint file against its manifest found."""

    VERIFIED = "verified"
    #: No manifest: a file saved by plain Lightning; only loading it can tell.
    NO_MANIFEST = "no manifest"
    MISSING = "missing"
    #: Something else than a regular file (a directory, a device) has the checkpoint's name.
    NOT_A_FILE = "not a file"
    UNVERIFIABLE = "unverifiable"
    TORN = "torn"
    CORRUPT = "corrupt"
    #: A checkpoint directory lacks a file its manifest lists (or that a load needs).
    INCOMPLETE = "incomplete"
    #: The size matches an entry; the checksum has not been compared yet (see :func:`conclude`).
    UNCHECKED = "unchecked"

    @property
    def usable(self) -> bool:
        """Whether a load may use the file (verified, or unverified plain Lightning)."""
        return self in (Status.VERIFIED, Status.NO_MANIFEST)


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one checkpoint file.

    Attributes:
        status: What was found.
        size: The file's size (``None`` when missing).
        checksum: Its checksum, once computed.
        entry: The manifest entry it matches (verified only).
        candidates: The entries of its size, while the checksum is still to be compared.
    """

    status: Status
    size: int | None = None
    checksum: str | None = None
    entry: Entry | None = None
    candidates: tuple[Entry, ...] = field(default_factory=tuple)

    @property
    def reason(self) -> str:
        """Why a file cannot be used, as a phrase for messages (``"torn (12 bytes, ...)"``)."""
        if self.status is Status.TORN:
            return f"torn ({self.size} bytes, matching no entry of its manifest)"
        if self.status is Status.CORRUPT:
            return "corrupt (its checksum matches no entry of its manifest)"
        if self.status is Status.UNVERIFIABLE:
            return (
                "unverifiable (its manifest is unreadable: delete the manifest to load the file unverified, "
                "or restore both from a copy)"
            )
        return self.status.value


def precheck(path: Path) -> Verdict:
    """The checks that need no checksum: exists, has a readable manifest, has an entry of its size."""
    try:
        stat = path.stat()
    except FileNotFoundError:  # also a symbolic link to nothing
        return Verdict(Status.MISSING)
    if not S_ISREG(stat.st_mode):
        return Verdict(Status.NOT_A_FILE)
    size = stat.st_size
    entries = read_entries(path)
    if entries is None:
        return Verdict(Status.NO_MANIFEST, size)
    if not entries:
        return Verdict(Status.UNVERIFIABLE, size)
    candidates = sized(entries, size)
    if not candidates:
        return Verdict(Status.TORN, size)
    return Verdict(Status.UNCHECKED, size, candidates=tuple(candidates))


def conclude(pre: Verdict, size: int, checksum: str) -> Verdict:
    """Finish an ``UNCHECKED`` verdict with the file's measured size and checksum."""
    entry = match(pre.candidates, size, checksum)
    if entry is None:
        return Verdict(Status.CORRUPT, size, checksum)
    return Verdict(Status.VERIFIED, size, checksum, entry)


def check_file(path: Path) -> Verdict:
    """Check ``path`` against its manifest, checksum included."""
    pre = precheck(path)
    if pre.status is not Status.UNCHECKED:
        return pre
    return conclude(pre, *checksum_file(path))
