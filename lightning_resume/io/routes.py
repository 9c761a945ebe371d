"""The routes of a ``DurableCheckpointIO`` save: :class:`WriteNow` formats, writes and commits in the caller;
:class:`WriteBehind` snapshots in the caller and hands the rest to the writer process."""

from __future__ import annotations

import logging
import mmap
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import torch

from lightning_resume._compat.torch import record_torch_save, torch_records_supported
from lightning_resume._storage.archive import ArchiveWriter, Data, Sink
from lightning_resume._storage.commit import clean_stale, commit_file, save_error
from lightning_resume._storage.manifest import Entry
from lightning_resume._storage.writer import Aside, WriterDied, WriterProcess, carried_error, new_buffer
from lightning_resume.io.snapshot import HostBuffer, Staged, record_data, snapshot, torch_archive_version
from lightning_resume.io.write_stats import WriteStats

log = logging.getLogger(__name__)

#: Told of each commit on the durable tier (in the writer thread for :class:`WriteBehind`): the path,
#: its entry, how it was written (``None``: copied from node memory), what retention removed beside it.
OnCommit = Callable[[Path, Entry, WriteStats | None, list[str]], None]
#: The plugin's entry of the file a save replaces, asked once the save before it has committed.
Known = Callable[[], Entry | None]


class Route(Protocol):
    """How a save reaches the disk. ``fields``: the manifest entry but size and checksum; ``full_speed``: a
    write into memory, which other nodes await."""

    def save(
        self,
        checkpoint: dict[str, Any],
        target: Path,
        fields: dict[str, Any],
        known: Known,
        on_commit: OnCommit,
        full_speed: bool = False,
    ) -> None: ...
    def wait(self) -> None:
        """Until the save in flight is committed (hurrying it); raise its error if it failed."""

    def hurry(self) -> None:
        """The write in flight, and the next one, at full speed."""

    @property
    def busy(self) -> bool: ...
    def finish(self) -> None:
        """The end of ``fit``: :meth:`wait`, then free what the route holds (a later save starts again)."""


def write_torch_archive(obj: Any, out: Sink) -> None:
    """The format step in the caller: ``obj`` as a ``torch.save`` archive, record by record (no copy)."""
    writer: ArchiveWriter | None = None
    early: list[tuple[str, Data]] = []  # records before the alignment is known (data.pkl, ...)

    def start(alignment: int = 64) -> ArchiveWriter:
        started = ArchiveWriter(out, alignment)
        for name, content in early:
            started.add(name, content)
        return started

    def write_record(name: str, data: Any, nbytes: int) -> None:
        nonlocal writer
        content = record_data(data)
        if writer is None and name == ".storage_alignment":
            writer = start(int(bytes(content)))
        elif writer is None and name.startswith("data/"):
            writer = start()
        elif writer is None:
            early.append((name, content))
            return
        writer.add(name, content)

    record_torch_save(obj, write_record)
    (writer or start()).close(torch_archive_version())


class WriteNow:
    """The synchronous route: format, writer and commit before :meth:`save` returns; also the urgent path
    of every plugin (a preemption's last save, a save from a signal handler that interrupted another)."""

    busy = False

    def __init__(self, direct: bool, keep: int | None) -> None:
        self.direct, self.keep = direct, keep
        # torch.save's writer CRCs each storage whole before writing it: the disk would wait for the CPU.
        self._format: Callable[[Any, Sink], None] = (
            write_torch_archive if torch_records_supported() else torch.save  # type: ignore[assignment]
        )
        self._buffer: mmap.mmap | None = None  # reused (new pages are slow)
        self._buffer_busy = False

    def save(
        self,
        checkpoint: dict[str, Any],
        target: Path,
        fields: dict[str, Any],
        known: Known,
        on_commit: OnCommit,
        full_speed: bool = True,
    ) -> None:
        # A save from a signal handler may interrupt one in progress: it gets a buffer of its own.
        shared = not self._buffer_busy
        if shared and self._buffer is None:
            self._buffer = new_buffer()
        self._buffer_busy |= shared
        started = time.monotonic()
        try:
            aside = Aside(target, self.direct, self._buffer if shared else None)
            with aside as out:
                self._format(checkpoint, out)
            entry, pruned = commit_file(aside, fields, known(), self.keep)
        except OSError as e:
            raise save_error(e.errno, e.strerror or str(e), e.filename, target) from e
        finally:
            if shared:
                self._buffer_busy = False
        on_commit(
            target, entry, WriteStats(entry.size, time.monotonic() - started, aside.fsync_seconds), pruned
        )

    def wait(self) -> None:
        """Nothing in flight."""

    def hurry(self) -> None:
        """Always at full speed."""

    def finish(self) -> None:
        if not self._buffer_busy:
            self._buffer = None  # freed; a later save maps a new one


class WriteBehind:
    """The asynchronous route: the snapshot in the caller, the rest in the writer process (restarted and
    the write retried once if it dies), at ``share`` of full speed until something waits for it (then that
    write and the next at full speed); ``on_commit`` runs in the background thread."""

    def __init__(self, direct: bool, keep: int | None, share: float) -> None:
        self.direct, self.keep, self.share = direct, keep, share
        self._buffer = HostBuffer()
        self._process: WriterProcess | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[Entry] | None = None
        self._seq = 0  # of the newest write
        self._full_speed_seq = 0  # writes up to this one run at full speed
        self._next_at_full_speed = False

    @property
    def writer_pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.alive() else None

    def save(
        self,
        checkpoint: dict[str, Any],
        target: Path,
        fields: dict[str, Any],
        known: Known,
        on_commit: OnCommit,
        full_speed: bool = False,
    ) -> None:
        """Wait for the previous save (raising its error), snapshot ``checkpoint``, start writing it."""
        self.wait()
        staged = snapshot(checkpoint, self._buffer)
        self._seq += 1
        if self._next_at_full_speed or full_speed:
            self._full_speed_seq, self._next_at_full_speed = self._seq, False
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-resume-writer")
        write = (staged, target, fields, known, on_commit, self._seq)
        self._pending = self._executor.submit(self._write, *write)

    def wait(self) -> None:
        pending = self._pending
        if pending is None:
            return
        if not pending.done():
            self.hurry()
        try:
            pending.result()
        finally:
            if self._pending is pending:  # a nested wait (from a signal handler) may have cleared it
                self._pending = None

    def hurry(self) -> None:
        self._full_speed_seq, self._next_at_full_speed = self._seq, True
        if (process := self._process) is not None:
            process.hurry(self._seq)

    @property
    def busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def _write(
        self, staged: Staged, path: Path, fields: dict[str, Any], known: Known, on_commit: OnCommit, seq: int
    ) -> Entry:
        # Asked here, the previous write committed: a save from a signal handler may have committed this
        # very file while the caller took the snapshot.
        previous = known()
        request: dict[str, Any] = {
            "path": str(path),
            "records": staged.records,
            "alignment": staged.alignment,
            "version": torch_archive_version(),
            "buffer_size": staged.buffer_size,
            "entry": fields,
            "keep": self.keep,
            "direct": self.direct,
            "seq": seq,
        }
        for attempt in (1, 2):
            request["known"] = previous.to_json() if previous is not None and attempt == 1 else None
            try:
                writer = self._writer()
                # Read after the writer is known to hurry(): a later hurry reaches it through its pipe.
                request["share"] = 1.0 if self._full_speed_seq >= seq else self.share
                kind, payload = writer.request(("write", request))
                break
            except WriterDied as died:
                dead, self._process = self._process, None
                if dead is not None:
                    dead.kill()  # reap it; close its connection and hurry pipe
                clean_stale(path.parent)  # after a death, the disk says what is there
                if attempt == 2:
                    raise RuntimeError(
                        f"Could not save checkpoint {str(path)!r}: {died}, twice while writing it. The "
                        "previous checkpoint is intact. Check the system log for what kills it (OOM killer?)."
                    ) from died
                log.warning("%s; restarting it and writing %s again", died, path)
        if kind != "done":
            raise carried_error(payload, path)
        committed = Entry.from_json(payload["entry"])
        on_commit(path, committed, WriteStats(**payload["stats"]), payload["pruned"])
        return committed

    def _writer(self) -> WriterProcess:
        if self._process is None or not self._process.alive():
            if self._process is not None:
                self._process.kill()
            self._process = WriterProcess(self._buffer.fd)
        return self._process

    def finish(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._process is not None:
                self._process.close()
                self._process = None
            self._buffer.close()
