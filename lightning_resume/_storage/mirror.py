"""A remote copy of a checkpoint folder on any fsspec filesystem, laid out as the local one; an upload cut
short leaves the previous copy counting, a restore is committed as a save is. One writer per mirror URL."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from lightning_resume._storage.atomic import fsync_dir
from lightning_resume._storage.background import Background
from lightning_resume._storage.catalog import Status, scan, verify
from lightning_resume._storage.commit import commit, committed, newest_first, prune, remove
from lightning_resume._storage.kinds import (
    DIRECTORY,
    FILE,
    DirectoryKind,
    Kind,
    read_versions,
    resolve_pointer,
    swap_pointer,
)
from lightning_resume._storage.manifest import ChecksumWriter, R, Writable, next_entries, read_entries
from lightning_resume._storage.store import LocalStore, RemoteStore, put
from lightning_resume._storage.writer import Aside

log = logging.getLogger(__name__)

_CHUNK = 16 << 20


class ReadError(OSError):
    """Reading a copy failed, and not for lack of it (say, the remote object was replaced meanwhile)."""


class _NotCommitted(Exception):
    """A copied file matches no version of its manifest."""


def copy(source: IO[bytes], out: Writable) -> None:
    """Stream ``source`` into ``out`` (uploads and downloads; raises ``ReadError``)."""
    while True:
        try:
            chunk = source.read(_CHUNK)
        except FileNotFoundError:
            raise
        except OSError as e:  # e.g. the object was replaced between two ranged reads
            raise ReadError(str(e)) from e
        if not chunk:
            return
        out.write(chunk)


class Mirroring:
    """Upload, restore and delete checkpoints at ``url``, keeping ``keep`` per retention family."""

    def __init__(
        self,
        url: str,
        options: dict[str, Any] | None = None,
        keep: int | None = None,
        direct_io: bool = True,
        warn: Callable[[str], None] = log.debug,
    ) -> None:
        self.url = url
        self._warn = warn
        self.keep = keep
        self.direct_io = direct_io
        self.store = RemoteStore(url, options)
        self._known: dict[tuple[bool, str], Any] = {}  # what this process uploaded or downloaded
        self._failed: dict[tuple[bool, str], BaseException] = {}
        self._queue = Background("lightning-resume-mirror")
        self._started = False

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self.store.clear_uploads()

    def committed(self, kind: Kind[R]) -> dict[str, R]:
        """The remote ``catalog.committed`` checkpoints of ``kind``."""
        self._start()
        return committed(self.store, kind)

    def upload(self, kind: Kind[R], path: Path, record: R | None = None) -> bool:
        """Upload ``record`` (default: the manifest's) of the checkpoint ``path``; whether it is mirrored."""
        self._start()
        folder, name = path.parent, path.name
        record = record if record is not None else committed(LocalStore(folder), kind).get(name)
        if record is None:
            log.debug("%s has no committed manifest (replaced meanwhile); nothing to mirror", path)
            return False
        known = self._known.get((kind.directory, name))
        current = [known] if known is not None else kind.held(self.store, name)
        if current and current[0].same_data(record):
            if current[0] != record:  # the same bytes, new metadata
                put(self.store, kind.manifest_name(name), kind.encode([record]))
        else:
            staged: dict[str, str] = {}
            try:
                if not self._send(kind, folder, name, record, staged):
                    return False
                put(self.store, kind.manifest_name(name), kind.encode(next_entries(record, current)))
                kind.remote_swap(self.store, name, record, staged)
            finally:
                for final, key in staged.items():
                    if key != final:
                        self.store.remove(key)
            log.debug("mirrored %s to %s", path, self.store.key(name))
        self._known[(kind.directory, name)] = record
        if self.keep is not None or kind.directory:
            for gone in prune(self.store, kind, self.keep, name if kind.directory else None):
                self._known.pop((kind.directory, gone), None)
        return True

    def _send(self, kind: Kind[R], folder: Path, name: str, record: R, staged: dict[str, str]) -> bool:
        """Stream the files of ``record`` to their upload keys (recorded in ``staged``), checksummed."""
        for entry in kind.files(name, record):
            staged[entry.name] = key = kind.upload_key(entry.name)
            try:
                source = open(folder / entry.name, "rb")  # noqa: SIM115 (closed below)
            except FileNotFoundError:
                return False
            with source, self.store.open(key, "wb") as remote:
                out = ChecksumWriter(remote)
                copy(source, out)
            if (out.checksum.size, out.checksum.hexdigest()) != (entry.size, entry.checksum):
                if kind.directory:  # committed directories never change: this is damage
                    raise RuntimeError(
                        f"{str(folder / entry.name)!r} does not match its manifest: not mirroring"
                    )
                log.debug("%s changed during its upload; the next upload sends the new version", entry.name)
                return False
        return True

    def delete(self, kind: Kind[R], name: str) -> None:
        self._known.pop((kind.directory, name), None)
        self._failed.pop((kind.directory, kind.slot(name)), None)
        remove(self.store, kind, name)

    def restore(self, kind: Kind[R], folder: Path, name: str, attempts: int = 3) -> Path | None:
        """Download the remote checkpoint ``name`` into ``folder``, commit it; ``None`` if none verifies."""
        self._start()
        target = folder / kind.slot(name)
        for attempt in range(1, attempts + 1):
            if not (versions := read_versions(self.store, kind, name)):
                return None
            staged = kind.stage(target)
            try:
                record = self._receive(kind, name, versions, staged)
            except (_NotCommitted, FileNotFoundError, ReadError) as e:
                LocalStore(folder).remove(staged.name, tree=kind.directory)
                if attempt < attempts and not isinstance(e, FileNotFoundError):
                    log.debug("download of %s failed (%s); starting over", name, e)
                    continue
                if not isinstance(e, ReadError):
                    log.debug("not restoring %s from the mirror: %s", name, e)
                    return None
                raise OSError(
                    f"Could not download {self.store.key(name)!r} from the mirror ({attempts} attempts): "
                    f"{e}. Check that the mirror is reachable and that no other job writes to it."
                ) from e.__cause__
            local = kind.held(LocalStore(folder), name)
            final = commit(kind, staged, target, next_entries(record, local), name)
            self._known[(kind.directory, name)] = record
            log.info("restored %s from %s", final if kind.directory else target, self.store.key(name))
            return final
        return None

    def _receive(self, kind: Kind[R], name: str, versions: Sequence[R], staged: Path) -> R:
        """Download the files of ``name`` into ``staged``; return the version they all match."""
        digests = {}
        for entry in kind.files(name, versions[0]):  # every version has the same file names
            local = Path(f"{staged}{entry.name[len(name) :]}")  # the checkpoint's name -> ``staged``
            local.parent.mkdir(parents=True, exist_ok=True)
            aside = Aside(local, self.direct_io, path=local)
            with self.store.open(entry.name, "rb") as source, aside as out:
                copy(source, out)
            digests[entry.name] = (aside.size, aside.checksum)
        for folder, _, _ in os.walk(staged):  # a directory: every folder in it
            fsync_dir(folder)
        for record in versions:
            if all(digests.get(f.name) == (f.size, f.checksum) for f in kind.files(name, record)):
                return record
        raise _NotCommitted(f"the mirror copy of {name!r} matches no version of its manifest")

    def restore_all(self, folder: Path) -> list[Path]:
        """Download the remote files ``folder`` lacks or holds older versions of, and the newest directory."""
        restored = []
        local = scan(folder)
        for name, entry in sorted(self.committed(FILE).items(), key=lambda item: -item[1].saved_at):
            have = local.get(name)
            if have is not None and (have.same_data(entry) or have.saved_at >= entry.saved_at):
                continue
            if have is None and (folder / name).exists() and read_entries(folder / name) is None:
                continue  # a file we did not write
            if (path := self.restore(FILE, folder, name)) is not None:
                restored.append(path)
        path = self.restore_directory(folder)
        return restored if path is None else [*restored, path]

    def restore_directory(self, folder: Path, pointer: str = DIRECTORY.pointer) -> Path | None:
        """Restore the newest remote directory that verifies and link ``pointer`` to it, unless as new."""
        kind = DirectoryKind(pointer)
        remote = self.committed(kind)
        pointed = kind.remote_target(self.store)
        order = [pointed] if pointed in remote else []
        order += [n for n in newest_first(remote) if n != pointed]
        if not order:
            return None
        local = committed(LocalStore(folder), kind)
        target = resolve_pointer(folder / kind.pointer)
        have = local.get(target.name) if target is not None else None
        if have is not None and have.saved_at >= remote[order[0]].saved_at:
            return None
        for name in order:
            if name in local and verify(folder / name, kind).status is Status.VERIFIED:
                swap_pointer(folder / kind.pointer, name)
                return folder / name
            if (path := self.restore(kind, folder, name)) is not None:
                return path
        return None

    def submit(self, kind: Kind[R], path: Path, latest: Callable[[], R | None]) -> None:
        """Queue :meth:`upload` of ``path``'s version ``latest()`` (unless one is queued already); a failure
        is warned about and raised by :meth:`wait`."""
        failure = (kind.directory, kind.slot(path.name))

        def job() -> None:
            if (record := latest()) is None:
                return
            try:
                self.upload(kind, path, record)
                self._failed.pop(failure, None)
            except Exception as e:
                self._failed[failure] = e
                self._warn(
                    f"Mirroring {str(path)!r} to {self.url!r} failed ({type(e).__name__}: {e}); the local "
                    "checkpoint is intact and the next save tries again."
                )

        self._queue.submit(job, (kind.directory, path.name))

    def submit_delete(self, kind: Kind[R], name: str) -> None:
        self._queue.submit(lambda: self.delete(kind, name))

    @property
    def pending(self) -> int:
        return self._queue.pending

    def wait(self, timeout: float | None = None) -> None:
        """Wait for queued uploads and deletions (``TimeoutError``; ``RuntimeError``: an upload failed)."""
        if running := self._queue.wait(timeout):  # deletions raise here; uploads record their errors
            raise TimeoutError(
                f"{running} mirror operation(s) to {self.url!r} still running after {timeout} s; the "
                "remote copies they were writing are not committed (the local checkpoints are)."
            )
        if self._failed:
            (_, name), error = next(iter(self._failed.items()))
            raise RuntimeError(
                f"Mirroring {name!r} to {self.url!r} failed: {type(error).__name__}: {error}. The local "
                "checkpoint is intact; the mirror holds an older committed copy or none."
            ) from error

    def close(self, timeout: float | None = None) -> None:
        """:meth:`wait`, warning instead of raising (not to mask a preempted fit's error); stop the thread."""
        try:
            self.wait(timeout)
        except (TimeoutError, RuntimeError) as e:
            self._warn(str(e))
        finally:
            self._queue.stop()
