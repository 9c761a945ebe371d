"""One checkpoint save in flight: snapshot now, write in the writer process (restarted and retried once
from the same snapshot if it dies). Writes start gently; one the trainer waits for goes at full speed,
and so does the next."""

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
    """Snapshot in the caller, write in a writer process; ``on_commit`` runs in the background thread."""

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
        return self._process.pid if self._process is not None and self._process.alive() else None

    def save(
        self, checkpoint: dict[str, Any], path: Path, entry: dict[str, Any], full_speed: bool = False
    ) -> None:
        """Wait for the previous save (raising its error), snapshot ``checkpoint``, start writing it (at
        full speed with ``full_speed``: a write into memory, which other nodes wait for)."""
        self.wait()
        staged = stage(checkpoint, self._buffer)
        self._seq += 1
        if self._next_at_full_speed or full_speed:
            self._full_speed_seq, self._next_at_full_speed = self._seq, False
        self._pending = self._executor.submit(self._write, staged, path, entry, self._seq)

    def wait(self) -> Entry | None:
        """Block until the save in flight is committed (hurrying it); raise its error if it failed."""
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
        self._full_speed_seq, self._next_at_full_speed = self._seq, True
        if (process := self._process) is not None:
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
