"""Which checkpoints of a folder load, one rule for all: **verified** (committed, checksums matching), in
fallback order **newest save first** (``commit.newest_first``) after what the pointer names."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import Any, Generic

from lightning_resume._storage.commit import committed, newest_first
from lightning_resume._storage.kinds import FILE, DirectoryKind, Kind, resolve_pointer
from lightning_resume._storage.manifest import Entry, NewerManifest, R, checksum_file
from lightning_resume._storage.store import LocalStore
from lightning_resume._version import __version__

#: The fallback rule as the docs state it (``docs/src/how_resume_works.md``; a test compares them).
FALLBACK_RULE = (
    "A checkpoint that does not verify falls back to the other committed checkpoints of its folder, "
    "newest save first; the first that verifies is loaded."
)


def scan(folder: str | Path) -> dict[str, Entry]:
    """:func:`committed` checkpoint files of a local folder."""
    return committed(LocalStore(Path(folder)), FILE)


def candidates(pointer: Path) -> list[Path]:
    """Checkpoint directories a restart may resume from: the pointer's target, then :func:`newest_first`."""
    target = resolve_pointer(pointer)
    found = committed(LocalStore(pointer.parent), DirectoryKind(pointer.name))
    others = newest_first(found, exclude=[target.name] if target is not None else [])
    return ([] if target is None else [target]) + [pointer.parent / name for name in others]


class Status(enum.Enum):
    """What checking a checkpoint against its manifest found."""

    VERIFIED = "verified"
    NO_MANIFEST = "no manifest"  #: saved by plain Lightning; only loading it can tell
    MISSING = "missing"
    NOT_A_FILE = "not a file"  #: a directory, a device... has the checkpoint file's name
    UNVERIFIABLE = "unverifiable"
    TORN = "torn"
    CORRUPT = "corrupt"
    INCOMPLETE = "incomplete"  #: a checkpoint directory lacks a file its manifest lists

    @property
    def usable(self) -> bool:
        """Whether a load may use the checkpoint (verified, or unverified plain Lightning)."""
        return self in (Status.VERIFIED, Status.NO_MANIFEST)


@dataclass(frozen=True)
class Verdict(Generic[R]):
    """What checking one checkpoint found; ``manifest``: the version it matches, else its newest."""

    status: Status
    manifest: R | None = None
    detail: str = ""
    size: int | None = None
    checksum: str | None = None
    newer: bool = False

    @property
    def reason(self) -> str:
        """Why it cannot be used, for messages: ``"torn (__0_0.distcp has 12 bytes, manifest says 57)"``."""
        return self.status.value + (f" ({self.detail})" if self.detail else "")


def verify(path: Path, kind: Kind[R], checksums: bool = True, share: tuple[int, int] = (0, 1)) -> Verdict[R]:
    """Check a checkpoint (a file, a directory, or a link to one) against its manifest; ``checksums=False``:
    sizes only; ``share=(rank, world size)``: hash only every world-size-th file (ranks share the work)."""
    if (absent := _absent(path, kind.directory)) is not None:
        return absent
    folder, name = path.parent, path.name
    size = None if kind.directory else path.stat().st_size
    try:
        raw = (folder / kind.manifest_name(name)).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return Verdict(Status.NO_MANIFEST, size=size)
    try:
        versions = kind.decode(raw)
    except NewerManifest as e:
        return Verdict(Status.UNVERIFIABLE, detail=newer_detail(e), size=size, newer=True)
    except ValueError as e:
        fix = "delete the manifest to load it unverified, or restore both from a copy"
        return Verdict(Status.UNVERIFIABLE, detail=f"its manifest is unreadable: {e}; {fix}", size=size)
    sized: list[R] = []
    problem = Verdict(Status.TORN, versions[0], f"{size} bytes, matching no entry of its manifest", size)
    for record in versions:
        trouble = _sizes(folder, kind, name, record)
        if trouble is None:
            sized.append(record)
        elif kind.directory:
            problem = trouble
    if not sized:
        return problem
    if not checksums:
        return Verdict(Status.VERIFIED, sized[0], size=size)
    digests: dict[str, tuple[int, str]] = {}
    rank, world = share
    mismatches = []
    for record in sized:
        shared = [f for i, f in enumerate(kind.files(name, record)) if i % max(world, 1) == rank]
        try:
            digests.update({f.name: checksum_file(folder / f.name) for f in shared if f.name not in digests})
        except (FileNotFoundError, NotADirectoryError) as e:
            # Removed while being read (retention pruning it, a concurrent gc): gone, not an error.
            gone = Path(e.filename or name).name
            return Verdict(Status.INCOMPLETE, record, f"{gone} is missing (removed while checked)", size)
        mismatches = [f.name for f in shared if digests[f.name] != (f.size, f.checksum)]
        if not mismatches:
            return Verdict(Status.VERIFIED, record, size=size, checksum=digests.get(name, (0, None))[1])
    # A directory names its file; a file has up to three versions, and matches none of them.
    detail = f"{mismatches[0].split('/', 1)[-1]} does not match its checksum" if kind.directory else ""
    detail = detail or "its checksum matches no entry of its manifest"
    return Verdict(Status.CORRUPT, sized[0], detail, size, digests.get(name, (0, None))[1])


def newer_detail(error: NewerManifest) -> str:
    """Who wrote a manifest of a newer format, and that upgrading fixes it."""
    writer = f"lightning-resume {error.writer}" if error.writer else ""
    writer = writer or f"a lightning-resume of format {error.version}"
    return (
        f"written by {writer}, newer than this lightning-resume {__version__}: upgrade lightning-resume "
        "(pip install -U lightning-resume) to load it"
    )


def remedy(newer: bool, restore: str) -> str:
    """What to do about checkpoints that do not verify: upgrade for a newer format, else restore a copy."""
    return "Upgrade lightning-resume" if newer else f"Restore {restore} from a copy"


def _absent(path: Path, directory: bool) -> Verdict[Any] | None:
    """``MISSING`` (or ``NOT_A_FILE``) when nothing of the expected type is at ``path``."""
    try:
        mode: int | None = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # also a symbolic link to nothing
        mode = None
    if not directory:
        if mode is None:
            return Verdict(Status.MISSING)
        return None if S_ISREG(mode) else Verdict(Status.NOT_A_FILE)
    if mode is not None and S_ISDIR(mode):
        return None
    if path.is_symlink():
        detail = f"{path.name} points at {os.readlink(path)}, which does not exist"
    else:
        detail = "no such directory" if mode is None else "not a directory"
    return Verdict(Status.MISSING, detail=detail)


def _sizes(folder: Path, kind: Kind[R], name: str, record: R) -> Verdict[R] | None:
    """``INCOMPLETE`` or ``TORN`` for the first file of ``record`` that is missing or of another size."""
    for entry in kind.files(name, record):
        short = entry.name.split("/", 1)[-1]
        try:
            size = (folder / entry.name).stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return Verdict(Status.INCOMPLETE, record, f"{short} is missing")
        if size != entry.size:
            return Verdict(Status.TORN, record, f"{short} has {size} bytes, manifest says {entry.size}")
    return None


def check_file(path: Path) -> Verdict[Entry]:
    return verify(path, FILE)
