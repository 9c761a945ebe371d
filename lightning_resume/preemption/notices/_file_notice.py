"""``FileNotice``: a file whose appearance means "preempted" (a Kubernetes preStop hook can create it)."""

from __future__ import annotations

import os
from pathlib import Path

from lightning_resume._scheduler.environment import ENV
from lightning_resume.preemption.notices._notice import Notice, parse_deadline
from lightning_resume.preemption.notices._notice_source import NoticeSource
from lightning_resume.run_dir.resolve import process_start_time

MAX_BYTES = 4096  # bytes of the file read for its deadline


class FileNotice(NoticeSource):
    """A notice given by creating a file: anything that can run a command can warn the job.

    The file's appearance is the notice. It may hold the deadline, as seconds since the epoch
    (``date -d '+25 seconds' +%s > FILE``) or an ISO 8601 time (``2026-05-01T12:00:00Z``); empty, the
    notice has no deadline (the handler saves and trains on until the signal). A file older than this
    process (left by an earlier attempt) is ignored with one warning: delete it between attempts. One
    written since the process started counts, even before this source existed. Node-local: the first
    process of each node polls it. In a Kubernetes pod, a ``preStop`` hook that writes the file and
    then sleeps gives the job the hook's time before the SIGTERM::

        lifecycle:
          preStop:
            exec:
              command: ["sh", "-c", "date -d '+25 seconds' +%s > /tmp/preempted; sleep 20"]

    Args:
        path: The file. Default: ``$LIGHTNING_RESUME_NOTICE`` (read at each poll); without either, the
            source does not apply.
        interval: Seconds between two looks at the file.

    Raises:
        TypeError: ``path`` is not a path, or ``interval`` not a number.
        ValueError: an empty ``path``, or a non-positive ``interval``.

    Example::

        PreemptionHandler(notices=Notices([FileNotice("/tmp/preempted")]))
    """

    name = "file"

    def __init__(self, path: str | Path | None = None, interval: float = 1.0) -> None:
        super().__init__(interval=interval, timeout=1.0)
        if path is not None and not isinstance(path, (str, Path)):
            raise TypeError(f"path must be a file path or None, got {path!r}.")
        if path is not None and not str(path).strip():
            raise ValueError(f"path must be a file path or None, got {path!r}.")
        self.path = Path(path) if path is not None else None
        # Not construction time: a preStop hook may write the file while the job is still importing.
        self._since = process_start_time()

    @property
    def target(self) -> Path | None:
        """The file watched: ``path``, else ``$LIGHTNING_RESUME_NOTICE``, else ``None``."""
        if self.path is not None:
            return self.path
        variable = os.environ.get(ENV["notice_file"], "").strip()
        return Path(variable) if variable else None

    def applies(self) -> bool:
        """With a ``path``, or with ``$LIGHTNING_RESUME_NOTICE`` set."""
        return self.target is not None

    def describe(self) -> str:
        return f"{self.name} {self.target}"

    def _poll(self, now: float) -> Notice | None:
        target = self.target
        if target is None:
            return None
        try:
            with open(target, "rb") as f:
                modified = os.fstat(f.fileno()).st_mtime
                content = f.read(MAX_BYTES).decode("utf-8", "replace")
        except FileNotFoundError:
            return None
        if modified < self._since:
            self.last_error = (
                f"{target} is older than this process (left by an earlier attempt?): ignored. Delete it "
                "between attempts; a notice is a file created while the job runs"
            )
            return None
        try:
            deadline = parse_deadline(content)
        except ValueError:
            deadline = None
            self.last_error = (
                f"{target} holds {content.strip()[:100]!r}, not a deadline (seconds since the epoch, or an "
                "ISO 8601 time such as 2026-05-01T12:00:00Z): taken as a notice without a deadline"
            )
        return Notice(self.name, "file", deadline, detail=str(target), received=now)
