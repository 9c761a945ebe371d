from __future__ import annotations

import fcntl
import os
import socket
import subprocess
from pathlib import Path

import pytest

from lightning_resume.exceptions import RunDirError
from lightning_resume.run_dir.layout import LOCK
from lightning_resume.run_dir.owner import RunLock, is_gone, own_record


def free(path: Path) -> bool:
    """Whether nobody holds the lock on ``path`` (tried through a descriptor of its own)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    lock = RunLock(tmp_path)
    lock.acquire()
    assert not free(tmp_path / LOCK)
    started_r, started_w = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:  # a data-loader worker, say: it lives on while the parent lets go
        os.write(started_w, b"s")  # fork's hooks have run by now
        os.read(go_r, 1)
        os._exit(0 if not lock.held else 1)
    try:
        os.read(started_r, 1)
        lock.release()
        assert free(tmp_path / LOCK)  # the live child holds nothing
    finally:
        os.write(go_w, b"x")
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_lock_is_refused_to_another_open_file_and_shared_within_one_holder(tmp_path: Path) -> None:
    lock = RunLock(tmp_path)
    lock.acquire()
    lock.acquire()  # again: nothing changes
    RunLock(tmp_path).acquire()  # a second RunDir of this process shares it
    assert not free(tmp_path / LOCK)
    lock.release()
    assert free(tmp_path / LOCK)


def test_a_dead_owner_of_this_machine_is_gone_and_nothing_unknown_is() -> None:
    mine = own_record()
    assert not is_gone(mine)
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process now
    assert is_gone({**mine, "pid": dead.pid})
    assert is_gone({**mine, "start": mine["start"] + 1})  # the pid was reused by another process
    assert not is_gone({**mine, "pid": dead.pid, "host": "elsewhere"})
    assert not is_gone({**mine, "pid": dead.pid, "boot": None})
    assert not is_gone({**mine, "pid": dead.pid, "pid_namespace": "pid:[1]"})
    assert not is_gone({"pid": dead.pid, "host": socket.gethostname()})  # an earlier version's record
    assert not is_gone({})


def test_a_lock_file_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    (tmp_path / LOCK).mkdir()
    with pytest.raises(RunDirError, match="Cannot take the lock of run dir") as refused:
        RunLock(tmp_path).acquire()
    assert "\n" not in str(refused.value)
