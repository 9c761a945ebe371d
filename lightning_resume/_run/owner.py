"""``RunLock``: one live attempt per run dir.

Two attempts that share a session key (a job submitted twice with one explicit key, a rerun while
the first is still running) would resolve to the same run dir and write into it at once. The
process that trains in a run dir (global rank 0) holds an advisory lock on ``<run dir>/.lock`` for
as long as it uses the run dir; the kernel drops it when the process dies, however it dies, so a
restart after a kill always gets it. The lock file also says who holds it, for the error message.
Filesystems without locks (some NFS set-ups) get no protection, and a debug line says so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from lightning_resume._run import layout
from lightning_resume.exceptions import RunDirError

log = logging.getLogger(__name__)


class RunLock:
    """The lock of one run dir, taken by :meth:`acquire` and given up by :meth:`release`."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / layout.LOCK
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise naming the live attempt that holds it.

        A lock held by this very process (a second ``RunDir`` of one job) is shared, not refused.

        Raises:
            RunDirError: another live process trains in this run dir.
        """
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = read_owner(self.path)
            if owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
                return
            raise RunDirError(
                f"The run dir {str(self.path.parent)!r} is in use by another live attempt "
                f"({describe(owner)}): two attempts of one session would write into one run. Wait until it "
                "ends (or stop it), or give this job its own key (RunDir(key=...) or $LIGHTNING_RESUME_KEY).",
                self.path.parent,
            ) from None
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                log.debug("no advisory locks on %s (%s): concurrent attempts go undetected", self.path, e)
                return
            raise
        self._fd = fd
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
        with contextlib.suppress(OSError):  # the record only improves the message of a refused attempt
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode(), 0)

    def release(self) -> None:
        """Give the lock up (the file stays; an unlocked file means nobody trains here)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def read_owner(path: Path) -> dict[str, Any]:
    """Who wrote the lock file last (``{}`` when it cannot be read)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(owner: dict[str, Any]) -> str:
    """``pid 1234 on node7, since 2026-11-23 10:00:00`` for messages."""
    if not owner:
        return "owner unknown"
    since = owner.get("since")
    stamp = time.localtime(since) if isinstance(since, (int, float)) else None
    when = time.strftime("%Y-%m-%d %H:%M:%S", stamp) if stamp is not None else "?"
    return f"pid {owner.get('pid')} on {owner.get('host')}, since {when}"
