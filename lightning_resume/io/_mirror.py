"""A remote copy of a checkpoint directory on any fsspec filesystem (S3, GCS, a mounted directory...).

Remote layout, flat under the mirror URL: ``<name>`` and ``<name>.manifest.json``, as locally. An
upload streams the local file to a temporary key (checksumming it on the way), uploads the manifest
(new entry first, the remote file's current entry kept), then moves the temporary key onto
``<name>``. A remote copy counts only when its data matches an entry of its manifest, so an upload
interrupted at any point leaves the previous remote copy counted and the new one not.

Sharded checkpoints (directories, see :mod:`lightning_resume._writer.directory`) are mirrored as
``<url>/.lr-ckpt-<step>-<hex>/<files>``, each file checksummed against the directory's manifest on
the way, then the manifest, then a pointer object ``<url>/last.ckpt.pointer.json`` naming the
directory (the remote commit: object stores have no symlinks and no atomic directory rename).
Older remote directories are deleted only after the pointer names the new one.

Assumes one writer per mirror URL (one training run): temporary keys found at start are stale.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

from lightning_resume._warnings import warn
from lightning_resume._writer import catalog, directory
from lightning_resume._writer.atomic import fsync_dir
from lightning_resume._writer.commit import commit
from lightning_resume._writer.manifest import (
    MANIFEST_SUFFIX,
    Checksum,
    Entry,
    encode,
    match,
    next_entries,
    parse,
    sized,
)
from lightning_resume.io._retention import to_delete

log = logging.getLogger(__name__)

INSTALL_HINT = 'pip install "lightning-resume[remote]"'
_TEMP = ".lr-upload-"
_CHUNK = 16 << 20
#: ``<url>/<pointer name><POINTER_SUFFIX>`` names the committed remote checkpoint directory.
POINTER_SUFFIX = ".pointer.json"
POINTER_FORMAT = "lightning-resume/directory-pointer"


def open_filesystem(url: str, options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """``(fsspec filesystem, root path)`` for ``url``, with an install hint when a backend is missing.

    Raises:
        ImportError: fsspec, or the backend for the URL's protocol (s3fs for ``s3://``), is missing.
        ValueError: the URL names no protocol fsspec knows.
    """
    try:
        import fsspec
    except ImportError as e:
        raise ImportError(f"DurableCheckpointIO(mirror={url!r}) needs fsspec: {INSTALL_HINT}") from e
    try:
        fs, root = fsspec.core.url_to_fs(url, **(options or {}))
    except ImportError as e:
        raise ImportError(
            f"DurableCheckpointIO(mirror={url!r}) needs the fsspec backend for it ({e}): {INSTALL_HINT}"
        ) from e
    except ValueError as e:
        raise ValueError(f"DurableCheckpointIO cannot mirror to {url!r}: {e}") from e
    return fs, str(root).rstrip("/")


class Mirror:
    """Upload, download and delete checkpoints under one fsspec URL; uploads run in a background thread.

    Args:
        url: The mirror, e.g. ``s3://bucket/run-42/checkpoints`` or ``/mnt/shared/run-42``.
        options: Keyword arguments for the fsspec filesystem (``{"client_kwargs": {"endpoint_url": ...}}``).
        keep: Keep only the newest ``keep`` committed copies per name pattern (``None``: no limit).
        direct_io: Write downloads past the page cache where the local filesystem allows it.
    """

    def __init__(
        self,
        url: str,
        options: dict[str, Any] | None = None,
        keep: int | None = None,
        direct_io: bool = True,
    ) -> None:
        self.url = url
        self.keep = keep
        self.direct_io = direct_io
        self.fs, self.root = open_filesystem(url, options)
        self._known: dict[str, Entry] = {}
        self._lock = threading.Lock()
        self._queued: set[str] = set()
        self._futures: list[Future[None]] = []
        self._failed: dict[str, BaseException] = {}
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], Future[None]] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._started = False

    def key(self, name: str) -> str:
        return f"{self.root}/{name}"

    # -- remote state -------------------------------------------------------------------------

    def _start(self) -> None:
        """Create the root and delete temporary keys of interrupted uploads (once)."""
        if self._started:
            return
        self._started = True
        with contextlib.suppress(OSError, NotImplementedError):
            self.fs.makedirs(self.root, exist_ok=True)
        for info in self._listing():
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(_TEMP):
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(info["name"])

    def _listing(self) -> list[dict[str, Any]]:
        self.fs.invalidate_cache(self.root)
        try:
            return [i for i in self.fs.ls(self.root, detail=True) if i.get("type") != "directory"]
        except FileNotFoundError:
            return []

    # -- the catalog's Storage protocol -----------------------------------------------------------

    def sizes(self) -> dict[str, int]:
        """Every remote file with its size, temporary keys of uploads left out."""
        listed = {i["name"].rstrip("/").rsplit("/", 1)[-1]: int(i.get("size") or 0) for i in self._listing()}
        return {name: size for name, size in listed.items() if not name.startswith(_TEMP)}

    def read_manifest(self, name: str) -> bytes | None:
        """The raw manifest of the remote copy of ``name``, or ``None``."""
        try:
            return bytes(self.fs.cat_file(self.key(name) + MANIFEST_SUFFIX))
        except FileNotFoundError:
            return None

    def _entries(self, name: str) -> list[Entry] | None:
        return parse(self.read_manifest(name))

    def committed(self) -> dict[str, Entry]:
        """Remote checkpoints whose data size matches an entry of their manifest (newest such entry)."""
        self._start()
        return catalog.committed(self)

    def _current(self, name: str) -> list[Entry]:
        """Entries that may describe the remote data of ``name`` now."""
        if name in self._known:
            return [self._known[name]]
        self.fs.invalidate_cache(self.root)
        try:
            size = int(self.fs.size(self.key(name)))
        except FileNotFoundError:
            return []
        return sized(self._entries(name) or [], size)

    def _put_manifest(self, name: str, entries: list[Entry]) -> None:
        temp = self.key(f"{_TEMP}{uuid.uuid4().hex}-{name}{MANIFEST_SUFFIX}")
        self.fs.pipe_file(temp, encode(entries).encode())
        self.fs.mv(temp, self.key(name) + MANIFEST_SUFFIX)

    # -- operations (synchronous) ----------------------------------------------------------------

    def upload(self, local: Path, entry: Entry) -> bool:
        """Upload the committed local file ``local`` described by ``entry``; return whether it did.

        Returns ``False`` without uploading when the local file no longer matches ``entry`` (a newer
        save replaced it; its own upload follows).
        """
        self._start()
        name = local.name
        current = self._current(name)
        if current and current[0].same_data(entry):
            if current[0] != entry:  # same bytes, new metadata
                self._put_manifest(name, [entry])
                self._known[name] = entry
            return True
        try:
            src = open(local, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            log.debug("%s was deleted before its upload; nothing to mirror", local)
            return False
        temp = self.key(f"{_TEMP}{uuid.uuid4().hex}-{name}")
        try:
            checksum = Checksum()
            with src, self.fs.open(temp, "wb") as dst:
                while chunk := src.read(_CHUNK):
                    checksum.update(chunk)
                    dst.write(chunk)
            if (checksum.size, checksum.hexdigest()) != (entry.size, entry.checksum):
                log.debug("%s changed during its upload; the next upload sends the new version", local)
                return False
            self._put_manifest(name, next_entries(entry, current))
            self.fs.mv(temp, self.key(name))
            self._known[name] = entry
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(temp)
        log.debug("mirrored %s to %s", local, self.key(name))
        if self.keep is not None:
            self.apply_retention()
        return True

    def download(self, name: str, target: Path, attempts: int = 3) -> Entry | None:
        """Download the committed remote copy of ``name`` to ``target`` (verified, atomic).

        An upload still landing (say, from a job that was just killed) can replace the remote copy
        while it is being read; the download then starts over, up to ``attempts`` times.

        Returns:
            Its entry, or ``None`` when the mirror has no copy of ``name`` that verifies.

        Raises:
            OSError: reading the remote copy failed ``attempts`` times, or writing ``target`` failed.
        """
        self._start()
        for attempt in range(1, attempts + 1):
            self.fs.invalidate_cache(self.root)
            entries = self._entries(name)
            if not entries:
                return None
            try:
                fetch, verified = (lambda out: self._fetch(name, out)), _verifier(name, entries)
                entry = commit(target, fetch, verified, direct=self.direct_io)
            except FileNotFoundError as e:
                log.debug("not restoring %s from the mirror: %s", name, e)
                return None
            except (_NotCommitted, _RemoteReadError) as e:
                if attempt < attempts:
                    log.debug("download of %s failed (%s); starting over", name, e)
                    continue
                if isinstance(e, _NotCommitted):
                    log.debug("not restoring %s from the mirror: %s", name, e)
                    return None
                raise OSError(
                    f"Could not download {self.key(name)!r} from the mirror ({attempts} attempts): "
                    f"{e.cause}. Check that the mirror is reachable and that no other job writes to it."
                ) from e.cause
            self._known[name] = entry
            log.info("restored %s from %s", target, self.key(name))
            return entry
        return None

    def _fetch(self, name: str, out: Any) -> None:
        with self.fs.open(self.key(name), "rb") as src:
            while True:
                try:
                    chunk = src.read(_CHUNK)
                except FileNotFoundError:
                    raise
                except OSError as e:  # e.g. the object was replaced between two ranged reads
                    raise _RemoteReadError(e) from e
                if not chunk:
                    return
                out.write(chunk)

    def delete(self, name: str) -> None:
        """Delete the remote copy of ``name``: manifest first, so a half-deleted copy never counts."""
        self._known.pop(name, None)
        self._failed.pop(name, None)
        for key in (self.key(name) + MANIFEST_SUFFIX, self.key(name)):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(key)

    def apply_retention(self) -> list[str]:
        """Delete remote copies beyond the newest ``keep`` per name pattern; return their names."""
        if self.keep is None:
            return []
        doomed = to_delete(self.committed(), self.keep)
        for name in doomed:
            self.delete(name)
        return doomed

    # -- checkpoint directories (sharded checkpoints) -------------------------------------------

    def read_pointer(self, pointer_name: str) -> str | None:
        """The remote directory ``<pointer_name>.pointer.json`` names, or ``None``."""
        try:
            data = json.loads(self.fs.cat_file(self.key(pointer_name + POINTER_SUFFIX)))
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("format") != POINTER_FORMAT:
            return None
        name = data.get("directory")
        return name if isinstance(name, str) and name.startswith(directory.COMMITTED_PREFIX) else None

    def committed_directories(self) -> dict[str, directory.DirectoryManifest]:
        """Remote checkpoint directories that pass the cheap check (manifest, every file of its size)."""
        self._start()
        self.fs.invalidate_cache(self.root)
        return directory.committed(RemoteDirectories(self))

    def upload_directory(self, local: Path, pointer_name: str) -> bool:
        """Upload the committed local directory ``local`` and point ``<pointer_name>`` at it.

        Files first (each checksummed against the manifest on the way), then the manifest, then the
        pointer object; then remote directories beyond ``keep`` are deleted. Returns ``False`` without
        uploading when ``local`` has no manifest (it was replaced or deleted meanwhile).

        Raises:
            RuntimeError: a local file no longer matches the manifest.
        """
        self._start()
        try:
            manifest = directory.read_manifest(local)
        except ValueError:
            manifest = None
        if manifest is None:
            log.debug("%s has no manifest (replaced meanwhile); nothing to mirror", local)
            return False
        remote = self.key(local.name)
        if self.read_pointer(pointer_name) != local.name:
            for folder in sorted({f"{remote}/{entry.name}".rsplit("/", 1)[0] for entry in manifest.files}):
                with contextlib.suppress(OSError, NotImplementedError):  # object stores have no folders
                    self.fs.makedirs(folder, exist_ok=True)
            for entry in manifest.files:
                checksum = Checksum()
                try:
                    src = open(local / entry.name, "rb")  # noqa: SIM115 (closed below)
                except FileNotFoundError:
                    return False  # deleted by retention: a newer directory is on its way
                with src, self.fs.open(f"{remote}/{entry.name}", "wb") as dst:
                    while chunk := src.read(_CHUNK):
                        checksum.update(chunk)
                        dst.write(chunk)
                if (checksum.size, checksum.hexdigest()) != (entry.size, entry.checksum):
                    raise RuntimeError(
                        f"{str(local / entry.name)!r} does not match its manifest: not mirroring {local.name}"
                    )
            self.fs.pipe_file(f"{remote}/{directory.MANIFEST_NAME}", manifest.to_json().encode())
            pointer = {"format": POINTER_FORMAT, "directory": local.name, "global_step": manifest.global_step}
            temp = self.key(f"{_TEMP}{uuid.uuid4().hex}-{pointer_name}{POINTER_SUFFIX}")
            self.fs.pipe_file(temp, json.dumps(pointer).encode())
            self.fs.mv(temp, self.key(pointer_name + POINTER_SUFFIX))
            log.debug("mirrored %s to %s", local, remote)
        self._directory_retention(local.name)
        return True

    def _directory_retention(self, current: str) -> None:
        keep = self.keep if self.keep is not None else 2
        listed = RemoteDirectories(self)
        self.fs.invalidate_cache(self.root)
        kept = set(catalog.newest_first(directory.committed(listed))[:keep]) | {current}
        for name in listed.directories():
            if name not in kept:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(f"{self.key(name)}/{directory.MANIFEST_NAME}")
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(self.key(name), recursive=True)

    def submit_directory_upload(self, local: Path, pointer_name: str) -> None:
        """Queue :meth:`upload_directory`; a failure is warned about and reported by :meth:`wait`."""

        def job() -> None:
            try:
                self.upload_directory(local, pointer_name)
            except Exception as e:
                self._failed[pointer_name] = e
                warn(
                    f"Mirroring {str(local)!r} to {self.url!r} failed ({type(e).__name__}: {e}); the local "
                    "checkpoint is intact and the next save tries again.",
                    all_ranks=True,
                )
                return
            self._failed.pop(pointer_name, None)

        self._submit(job)

    def restore_directory(self, folder: Path, pointer_name: str) -> Path | None:
        """Download the mirror's newest committed checkpoint directory into ``folder`` and point
        ``folder/<pointer_name>`` at it, unless ``folder`` already holds one at least as new.

        Tries the directory the remote pointer names first, then the other committed ones, newest
        first; each download is checksummed and renamed into place only when complete.

        Returns:
            The restored directory, or ``None`` when nothing was downloaded.
        """
        remote = self.committed_directories()
        pointed = self.read_pointer(pointer_name)
        order = [pointed] if pointed in remote else []
        order += [n for n in catalog.newest_first(remote) if n != pointed]
        if not order:
            return None
        pointer = folder / pointer_name
        local = directory.committed(directory.LocalDirectories(folder))
        target = directory.resolve_pointer(pointer)
        have = local.get(target.name) if target is not None else None
        if have is not None and have.saved_at >= remote[order[0]].saved_at:
            return None
        for name in order:
            manifest = remote[name]
            if name in local and directory.verify(folder / name).status is catalog.Status.VERIFIED:
                directory.swap_pointer(pointer, name)
                return folder / name
            save_dir = directory.new_save_dir(folder)
            try:
                for entry in manifest.files:
                    self._download_file(f"{self.key(name)}/{entry.name}", save_dir / entry.name, entry)
                for sub, _, _ in os.walk(save_dir):
                    fsync_dir(sub)
                directory.write_manifest(save_dir, manifest)
                os.replace(save_dir, folder / name)
                fsync_dir(folder)
            except (_NotCommitted, FileNotFoundError, _RemoteReadError) as e:
                log.debug("not restoring %s from the mirror: %s", name, e)
                shutil.rmtree(save_dir, ignore_errors=True)
                continue
            directory.swap_pointer(pointer, name)
            log.info("restored %s (%s) from %s", pointer, name, self.key(name))
            return folder / name
        return None

    def _download_file(self, key: str, target: Path, entry: directory.FileEntry) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        checksum = Checksum()
        with self.fs.open(key, "rb") as src, open(target, "wb") as dst:
            while True:
                try:
                    chunk = src.read(_CHUNK)
                except FileNotFoundError:
                    raise
                except OSError as e:
                    raise _RemoteReadError(e) from e
                if not chunk:
                    break
                checksum.update(chunk)
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        if (checksum.size, checksum.hexdigest()) != (entry.size, entry.checksum):
            raise _NotCommitted(f"the mirror copy of {key!r} does not match its manifest")

    # -- background queue ------------------------------------------------------------------------

    def submit_upload(self, local: Path, latest: Callable[[], Entry | None]) -> None:
        """Queue an upload of ``local``; ``latest`` gives its newest committed entry when it runs.

        An upload already queued (not started) for the same file covers this request too.
        """
        name = local.name
        with self._lock:
            if name in self._queued:
                return
            self._queued.add(name)

        def job() -> None:
            with self._lock:
                self._queued.discard(name)
            entry = latest()
            if entry is None:
                return
            try:
                self.upload(local, entry)
            except Exception as e:
                self._failed[name] = e
                warn(
                    f"Mirroring {str(local)!r} to {self.url!r} failed ({type(e).__name__}: {e}); the local "
                    "checkpoint is intact and the next save tries again.",
                    all_ranks=True,
                )
                return
            self._failed.pop(name, None)

        self._submit(job)

    def submit_delete(self, name: str) -> None:
        self._submit(lambda: self.delete(name))

    def _submit(self, job: Callable[[], None]) -> None:
        future: Future[None] = Future()
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                # A daemon thread: a preempted job that stops waiting for its uploads can still exit.
                self._jobs = queue.SimpleQueue()
                self._worker = threading.Thread(
                    target=self._run, args=(self._jobs,), name="lightning-resume-mirror", daemon=True
                )
                self._worker.start()
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(future)
            self._jobs.put((job, future))

    @staticmethod
    def _run(jobs: queue.SimpleQueue[tuple[Callable[[], None], Future[None]] | None]) -> None:
        while (item := jobs.get()) is not None:
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                job()
            except BaseException as e:
                future.set_exception(e)
            else:
                future.set_result(None)

    @property
    def pending(self) -> int:
        return sum(not f.done() for f in self._futures)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for queued uploads and deletes.

        Raises:
            TimeoutError: some are still running after ``timeout`` seconds.
            RuntimeError: the latest upload of some checkpoint failed.
        """
        with self._lock:
            futures = list(self._futures)
        done, not_done = wait_futures(futures, timeout=timeout)
        for future in done:
            future.result()  # deletes raise here; uploads record their errors
        if not_done:
            raise TimeoutError(
                f"{len(not_done)} mirror operation(s) to {self.url!r} still running after {timeout} s; the "
                "remote copies they were writing are not committed (the local checkpoints are)."
            )
        if self._failed:
            name, error = next(iter(self._failed.items()))
            raise RuntimeError(
                f"Mirroring {name!r} to {self.url!r} failed: {type(error).__name__}: {error}. The local "
                "checkpoint is intact; the mirror holds an older committed copy or none."
            ) from error

    def close(self, timeout: float | None = None) -> None:
        """Wait for queued work (see :meth:`wait`) and stop the background thread."""
        try:
            self.wait(timeout)
        finally:
            with self._lock:
                if self._worker is not None:
                    self._jobs.put(None)
                self._worker = None
                for future in self._futures:
                    future.cancel()


class RemoteDirectories:
    """The checkpoint directories under a mirror URL, as the directory catalog reads them."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror

    def directories(self) -> list[str]:
        try:
            listed = self.mirror.fs.ls(self.mirror.root, detail=True)
        except FileNotFoundError:
            return []
        names = (i["name"].rstrip("/").rsplit("/", 1)[-1] for i in listed if i.get("type") == "directory")
        return sorted(n for n in names if n.startswith(directory.COMMITTED_PREFIX))

    def file_sizes(self, name: str) -> dict[str, int]:
        base = self.mirror.key(name)
        try:
            found = self.mirror.fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        sizes = {}
        for path, info in found.items():
            relative = path.rstrip("/")[len(base.rstrip("/")) + 1 :]
            if relative and relative != directory.MANIFEST_NAME and info.get("type") != "directory":
                sizes[relative] = int(info.get("size") or 0)
        return sizes

    def read_manifest(self, name: str) -> bytes | None:
        try:
            return bytes(self.mirror.fs.cat_file(f"{self.mirror.key(name)}/{directory.MANIFEST_NAME}"))
        except FileNotFoundError:
            return None


class _NotCommitted(Exception):
    """A downloaded file matches no manifest entry."""


class _RemoteReadError(Exception):
    """Reading the remote copy failed (not for lack of it)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _verifier(name: str, entries: list[Entry]) -> Callable[[int, str], Entry]:
    def verified(size: int, checksum: str) -> Entry:
        found = match(entries, size, checksum)
        if found is None:
            raise _NotCommitted(f"the mirror copy of {name!r} matches no entry of its manifest")
        return found

    return verified
