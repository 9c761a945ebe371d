"""At most one checkpoint save in flight: snapshot now, write in the writer process, report later.

A writer that dies is restarted and the write retried once from the same snapshot (nothing touches
the buffer until the write is over). Writes start gently (``share``, see ``_writer.duty_cycle``);
whenever the trainer blocks on one (:meth:`AsyncSaver.wait`), it and the next go at full speed: the
trainer is waiting, so gentleness only makes it wait longer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lightning_resume._storage.cleanup import clean_stale
from lightning_resume._storage.manifest import Entry
from lightning_resume._writer.duty_cycle import WriteStats
from lightning_resume._writer.process import WriterDied, WriterProcess, carried_error
from lightning_resume.io._snapshot import HostBuffer, Staged, stage, torch_archive_version

log = logging.getLogger(__name__)


class AsyncSaver:
    """Snapshot in the caller, write in a writer process (see ``WriterProcess`` for the first three
    arguments), one save in flight. ``known(path)`` is the entry this process last committed there;
    ``on_commit(path, entry, stats)`` runs in the background thread after each commit."""

    def __init__(
        self,
        direct_io: bool,
        known: Callable[[Path], Entry | None],
        on_commit: Callable[[Path, Entry, WriteStats], None],
        share: float = 1.0,
    ) -> None:
        self.direct_io = direct_io
        self.share = share
        self._known = known
        self._on_commit = on_commit
        self._buffer = HostBuffer()
        self._process: WriterProcess | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-resume-writer")
        self._pending: Future[Entry] | None = None
        self._seq = 0  # of the newest write
        self._full_speed_seq = 0  # writes up to this one run at full speed
        self._next_at_full_speed = False

    @property
    def _writer_pid(self) -> int | None:
        """Process id of the current writer process, if one is running."""
        return self._process.pid if self._process is not None and self._process.alive() else None

    def save(self, checkpoint: dict[str, Any], path: Path, entry: dict[str, Any]) -> None:
        """Wait for the previous save, snapshot ``checkpoint`` and start writing it to ``path``.

        Raises:
            OSError, RuntimeError: the previous save's error, carried back from the writer.
        """
        self.wait()
        staged = stage(checkpoint, self._buffer)
        self._seq += 1
        if self._next_at_full_speed:
            self._full_speed_seq, self._next_at_full_speed = self._seq, False
        self._pending = self._executor.submit(self._write, staged, path, entry, self._seq)

    def wait(self) -> Entry | None:
        """Block until the save in flight is committed; raise its error if it failed.

        A write still in flight is switched to full speed, and so is the next one.
        """
        pending = self._pending
        if pending is None:
            return None
        if not pending.done():
            self.hurry()
        try:
            return pending.result()
        finally:
            if self._pending is pending:  # a nested wait (from a signal handler) may have cleared it
                self._pending = None

    def hurry(self) -> None:
        """Switch the write in flight, if any, and the next one to full speed."""
        self._full_speed_seq = self._seq
        self._next_at_full_speed = True
        process = self._process
        if process is not None:
            process.hurry(self._seq)

    @property
    def busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def _write(self, staged: Staged, path: Path, entry: dict[str, Any], seq: int) -> Entry:
        request: dict[str, Any] = {
            "path": str(path),
            "records": staged.records,
            "alignment": staged.alignment,
            "version": torch_archive_version(),
            "buffer_size": staged.buffer_size,
            "entry": entry,
            "direct": self.direct_io,
            "seq": seq,
        }
        for attempt in (1, 2):
            known = self._known(path) if attempt == 1 else None  # after a death, read the disk
            request["known"] = known.to_json() if known is not None else None
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
                clean_stale(path.parent)
                if attempt == 2:
                    raise RuntimeError(
                        f"Could not save checkpoint {str(path)!r}: {died}, twice while writing it. The "
                        "previous checkpoint is intact. Check the system log for what kills it (OOM killer?)."
                    ) from died
                log.warning("%s; restarting it and writing %s again", died, path)
        if kind != "done":
            raise carried_error(payload, path)
        committed = Entry.from_json(payload["entry"])
        self._on_commit(path, committed, WriteStats.from_json(payload["stats"]))
        return committed

    def _writer(self) -> WriterProcess:
        if self._process is None or not self._process.alive():
            if self._process is not None:
                self._process.kill()
            self._process = WriterProcess(self._buffer.fd)
        return self._process

    def close(self) -> None:
        """Wait for the save in flight (raising its error), then stop the writer and free the buffer."""
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
            if self._process is not None:
                self._process.close()
                self._process = None
            self._buffer.close()
