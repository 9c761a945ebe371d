"""``RunLock``: one live attempt per run dir, an ``flock`` on ``<run dir>/.lock`` held by global rank 0; the
file records the holder, so that a lock kept by a leftover of a dead process of this machine is replaced."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import pwd
import socket
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lightning_resume.exceptions import RunDirError
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.status import RunStatus, read_status

log = logging.getLogger(__name__)

_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)  # this filesystem has no advisory locks
_GUARD_TIMEOUT = 30.0  # how long an acquisition waits for another on the run dir (they take microseconds)

# The locks this process holds: a forked child closes its copies (a DataLoader worker outliving an OOM
# kill would keep a dead attempt's lock).
_HELD: weakref.WeakSet[RunLock] = weakref.WeakSet()
_AT_FORK_REGISTERED = False


class RunLock:
    """The lock of one run dir, taken by :meth:`acquire` and given up by :meth:`release`."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / layout.LOCK
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock (shared with this very process, taken over from a dead one of this machine)."""
        if self._fd is not None:
            return
        for _ in range(3):  # a stale lock file replaced: take the fresh one
            with _guard(self.path.parent):
                taken = self._try_acquire()
            if taken:
                return
        raise RunDirError(  # a stale lock file replaced three times over
            f"Could not take the lock {str(self.path)!r}: it was replaced repeatedly while trying. Retry; "
            "if it persists, check which processes open it (lsof).",
            self.path.parent,
        )

    def _try_acquire(self) -> bool:
        """One try, under the guard: ``True`` when done (taken or shared), ``False`` to try again."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise _lock_error(self.path, e) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_record(fd)
            os.close(fd)
            if owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
                return True
            if is_gone(owner):
                log.warning(
                    "The lock of run dir %s is held by a leftover of a dead attempt (%s, no longer running "
                    "on this machine) that inherited its descriptor; taking the run dir over.",
                    self.path.parent,
                    describe(owner),
                )
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                return False
            raise in_use_error(self.path.parent, owner) from None
        except OSError as e:
            os.close(fd)
            if e.errno in _NO_LOCKS:
                log.debug("no advisory locks on %s (%s): concurrent attempts go undetected", self.path, e)
                return True
            raise _lock_error(self.path, e) from e
        try:  # an old record left in place would name a dead owner: the lock would look stale
            os.ftruncate(fd, 0)
        except OSError as e:
            os.close(fd)
            raise _lock_error(self.path, e) from e
        self._fd = fd
        _forget_in_children(self)
        with contextlib.suppress(OSError):  # without a record the owner is "unknown": never stale
            os.pwrite(fd, json.dumps(own_record()).encode(), 0)
        return True

    def release(self) -> None:
        """Give the lock up (the file stays; an unlocked file means nobody trains here)."""
        fd, self._fd = self._fd, None
        _HELD.discard(self)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def in_use_error(run_dir: Path, owner: dict[str, Any]) -> RunDirError:
    """The refusal of an attempt whose run dir another live attempt holds."""
    return RunDirError(
        f"The run dir {str(run_dir)!r} is in use by another live attempt ({describe(owner)}): two attempts "
        "of one session would write into one run. Wait until it ends (or stop it), or give this job its own "
        "key (RunDir(key=...) or $LIGHTNING_RESUME_KEY).",
        run_dir,
    )


def _holder(run_dir: Path) -> dict[str, Any] | None:
    """The record of whoever holds ``run_dir``'s lock (``None``: nobody, or no locks here). Takes nothing."""
    try:
        fd = os.open(run_dir / layout.LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_record(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def live_holder(run_dir: Path) -> dict[str, Any] | None:
    """The record of the live attempt holding ``run_dir``'s lock (``{}``: it says nothing), or ``None``."""
    owner = _holder(run_dir)
    return None if owner is None or is_gone(owner) else owner


def in_use(run_dir: Path) -> bool:
    """Whether an attempt may still be using ``run_dir`` (the tools that delete ask first)."""
    owner = _holder(run_dir)
    if owner is not None:
        return not is_gone(owner)
    # No lock held (or no locks across hosts): running, by an owner not known to be gone.
    if read_status(run_dir)["status"] != RunStatus.RUNNING.value:
        return False
    return not is_gone(_json_object((run_dir / layout.LOCK).read_text))


@contextlib.contextmanager
def _guard(run_dir: Path) -> Iterator[None]:
    """A short exclusive lock on the run dir itself, serialising acquisitions of its ``.lock``."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise _lock_error(run_dir / layout.LOCK, e) from e
    try:
        deadline = time.monotonic() + _GUARD_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RunDirError(
                        f"Another process has been deciding about run dir {str(run_dir)!r} for "
                        f"{_GUARD_TIMEOUT:.0f} s (it holds a lock on the folder itself). Retry; if it "
                        "persists, find the process that holds it (lsof).",
                        run_dir,
                    ) from None
                time.sleep(0.005)
            except OSError:  # no locks on directories here (NFS): the acquisition runs unguarded
                break
        yield
    finally:
        os.close(fd)  # closing drops the guard


_LOCK_HINTS = {
    errno.EROFS: (
        "the runs root is on a read-only filesystem, and an attempt writes its checkpoints into the run "
        "dir. Remount it read-write, or copy the root to a writable place and relaunch with that root "
        "(the same key finds the run there)"
    ),
    errno.EACCES: "{who}. Run the restart as the run's owner, or give this user write access to the run dir",
    errno.EPERM: "{who}. Run the restart as the run's owner, or give this user write access to the run dir",
    errno.ENOSPC: "free space on that filesystem",
    errno.EDQUOT: "free space within your quota",
}


def _lock_error(path: Path, error: OSError) -> RunDirError:
    """The one-line error for a lock file that cannot be created or opened."""
    who = _ownership(path.parent)
    hint = _LOCK_HINTS.get(error.errno or 0, "check the run dir and the filesystem it is on").format(who=who)
    return RunDirError(
        f"Cannot take the lock of run dir {str(path.parent)!r} for this attempt ({error.strerror or error}): "
        f"{hint}.",
        path.parent,
    )


def _ownership(folder: Path) -> str:
    """``the run dir belongs to uid 1000 (alice); this process runs as uid 1001 (bob)``."""

    def name(uid: int) -> str:
        try:
            return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
        except KeyError:
            return f"uid {uid}"

    try:
        owner = folder.stat().st_uid
    except OSError:
        return "this process may not write it"
    return f"the run dir belongs to {name(owner)}; this process runs as {name(os.geteuid())}"


def _forget_in_children(lock: RunLock) -> None:
    global _AT_FORK_REGISTERED
    if not _AT_FORK_REGISTERED:
        os.register_at_fork(after_in_child=_close_in_child)
        _AT_FORK_REGISTERED = True
    _HELD.add(lock)


def _close_in_child() -> None:
    """In a forked child: drop every run-dir lock the parent holds (the child never trains there)."""
    for lock in list(_HELD):
        lock.release()


def _read_record(fd: int) -> dict[str, Any]:
    """The owner record through ``fd`` (``{}`` when it cannot be read)."""
    return _json_object(lambda: os.pread(fd, 4096, 0))


def _json_object(read: Callable[[], str | bytes]) -> dict[str, Any]:
    try:
        data = json.loads(read())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def own_record() -> dict[str, Any]:
    """What the lock file records about its holder: enough to tell, on this machine, that it died."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.time(),
        "boot": _boot_id(),
        "pid_namespace": _pid_namespace(),
        "start": process_start_ticks(os.getpid()),
    }


def is_gone(owner: dict[str, Any]) -> bool:
    """Whether the recorded owner is a process of this machine that no longer runs (unknown: never)."""
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0 or owner.get("host") != socket.gethostname():
        return False
    for key, now in (("boot", _boot_id), ("pid_namespace", _pid_namespace)):
        if owner.get(key) is None or owner.get(key) != now():
            return False
    try:
        os.kill(pid, 0)  # works where /proc hides other users' processes (hidepid)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, as another user's process
    start = process_start_ticks(pid)
    # Not readable: unknown, so not gone. A zombie or another process under the same pid: gone.
    return start is not None and (start == _ZOMBIE or start != owner.get("start"))


_ZOMBIE = -1  # a process that died and was not reaped yet


def process_start_ticks(pid: int | str) -> int | None:
    """When ``pid`` (or ``"self"``) started in clock ticks since boot (-1: a zombie; ``None``: unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return _ZOMBIE if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def describe(owner: dict[str, Any]) -> str:
    """``pid 1234 on node7, since 2026-11-23 10:00:00`` for messages."""
    if not owner:
        return "owner unknown"
    since = owner.get("since")
    stamp = time.localtime(since) if isinstance(since, (int, float)) else None
    when = time.strftime("%Y-%m-%d %H:%M:%S", stamp) if stamp is not None else "?"
    return f"pid {owner.get('pid')} on {owner.get('host')}, since {when}"
