"""Writes past the page cache (``O_DIRECT``): exact bytes, no cached pages, and the buffered fallback.

Where the page cache is bypassed is read back with util-linux ``fincore`` (which asks the kernel,
through ``mincore``, what of a file is cached). The fallback runs on a real ramfs, which refuses
direct I/O, mounted in a private mount namespace; one case that cannot be produced on a real
filesystem here (the flag accepted, a write refused) injects the error.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _system import can_unshare_mounts

from lightning_resume import DurableCheckpointIO
from lightning_resume._storage import writer
from lightning_resume._storage.writer import ALIGN, BLOCK, DEPTH, DirectFile, new_buffer


def write_direct(path: Path, pieces: list[bytes], depth: int = DEPTH, direct: bool = True) -> DirectFile:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with DirectFile(fd, new_buffer(depth), direct) as out:
            for piece in pieces:
                assert out.write(piece) == len(piece)
            out.finish()
        os.fsync(fd)
    finally:
        os.close(fd)
    return out


def io_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("lightning-resume-io")]


def cached_pages(path: Path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "PAGES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[0])


@pytest.mark.parametrize("depth", [1, DEPTH])
@pytest.mark.parametrize(
    "size", [0, 1, ALIGN - 1, ALIGN, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + ALIGN + 7, 6 * BLOCK + 3]
)
def test_every_size_is_written_exactly(tmp_path: Path, size: int, depth: int) -> None:
    data = os.urandom(size)
    cuts = sorted({0, size, size // 3, size // 3 + 1, size // 2, min(size, 100)})
    pieces = [data[a:b] for a, b in itertools.pairwise(cuts)]
    path = tmp_path / "file"
    out = write_direct(path, pieces, depth)
    assert out.size == size and out.tell() == size
    assert path.read_bytes() == data
    assert not io_threads()


def test_a_write_error_in_the_io_thread_is_raised_to_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pwrite, calls = os.pwrite, []

    def full_disk_at_third(fd: int, data: memoryview, offset: int) -> int:
        calls.append(threading.current_thread().name)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full_disk_at_third)
    with pytest.raises(OSError, match="No space"):
        write_direct(tmp_path / "file", [os.urandom(BLOCK)] * 8)
    assert calls[0].startswith("lightning-resume-io")  # written beside the caller, not by it
    assert not io_threads()  # stopped, before the caller closes the descriptor


def test_the_pace_hears_of_every_full_block_and_can_wait_for_the_disk(tmp_path: Path) -> None:
    class Pace:
        def __init__(self) -> None:
            self.blocks: list[int] = []

        def after_block(self, nbytes: int, drain: Callable[[], None]) -> None:
            self.blocks.append(nbytes)
            drain()
            assert not out._pending  # everything handed over is written

    pace = Pace()
    fd = os.open(tmp_path / "file", os.O_WRONLY | os.O_CREAT, 0o644)
    data = os.urandom(5 * BLOCK + 10)
    with DirectFile(fd, new_buffer(), pace=pace) as out:
        out.write(data)
        out.finish()
    os.close(fd)
    assert pace.blocks == [BLOCK] * 5  # the tail goes with finish(), after which nobody rests
    assert (tmp_path / "file").read_bytes() == data


def test_buffered_writes_are_written_back_as_they_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = writer._sync_file_range()
    if real is None:
        pytest.skip("no sync_file_range here")
    calls: list[tuple[int, int, int]] = []

    def spy(fd: int, offset: int, nbytes: int, flags: int) -> int:
        calls.append((offset, nbytes, flags))
        return real(fd, offset, nbytes, flags)

    monkeypatch.setattr(writer, "_sync_file_range", lambda: spy)
    data = os.urandom(3 * BLOCK + 5)
    write_direct(tmp_path / "file", [data], direct=False)
    start, wait = 2, 1 | 2 | 4
    assert calls == [
        (0, BLOCK, start),
        (BLOCK, BLOCK, start),
        (0, BLOCK, wait),
        (2 * BLOCK, BLOCK, start),
        (BLOCK, BLOCK, wait),
        (3 * BLOCK, 5, start),
        (2 * BLOCK, BLOCK, wait),
    ]
    assert (tmp_path / "file").read_bytes() == data


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux fincore")
def test_direct_writes_leave_nothing_in_the_page_cache(tmp_path: Path) -> None:
    data = os.urandom(3 * BLOCK + 12345)
    direct, buffered = tmp_path / "direct", tmp_path / "buffered"
    out = write_direct(direct, [data])
    assert out.direct, "the test folder's filesystem should take O_DIRECT"
    buffered.write_bytes(data)
    assert cached_pages(buffered) > 0  # the measurement sees cached pages where there are some
    assert cached_pages(direct) == 0
    assert direct.read_bytes() == data


def test_a_write_refused_after_the_switch_goes_on_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pwrite, calls = os.pwrite, []

    def refuse_second(fd: int, data: memoryview, offset: int) -> int:
        calls.append(offset)
        if len(calls) == 2:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", refuse_second)
    data = os.urandom(3 * BLOCK + 99)
    path = tmp_path / "file"
    out = write_direct(path, [data])
    assert not out.direct and calls[:3] == [0, BLOCK, BLOCK]  # the refused block is written again
    assert path.read_bytes() == data


RAMFS_JOB = r"""
import os, sys, zipfile
import torch
from lightning_resume import DurableCheckpointIO
from lightning_resume._storage.writer import DirectFile, new_buffer

folder = sys.argv[1]
fd = os.open(os.path.join(folder, "probe"), os.O_WRONLY | os.O_CREAT)
assert not DirectFile(fd, new_buffer()).direct, "ramfs should refuse O_DIRECT"
state = {"weights": torch.randn(3000, 1000), "step": 7}
io = DurableCheckpointIO()
path = os.path.join(folder, "last.ckpt")
io.save_checkpoint(state, path)
io.teardown()
loaded = DurableCheckpointIO().load_checkpoint(path)
assert torch.equal(loaded["weights"], state["weights"]) and loaded["step"] == 7
assert zipfile.ZipFile(path).testzip() is None
print("OK")
"""


@pytest.mark.skipif(not can_unshare_mounts(), reason="needs mount namespaces (unshare -m) to mount a ramfs")
def test_an_async_save_onto_a_filesystem_without_direct_io_is_written_buffered(tmp_path: Path) -> None:
    script, mount = tmp_path / "job.py", tmp_path / "ram"
    script.write_text(RAMFS_JOB)
    mount.mkdir()
    shell = f'mount -t ramfs ramfs "{mount}" && exec "{sys.executable}" "{script}" "{mount}"'
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux fincore")
@pytest.mark.parametrize("asynchronous", [True, False])
@pytest.mark.parametrize("direct_io", [True, False])
def test_checkpoints_are_valid_zips_written_past_the_page_cache_unless_asked_not_to(
    tmp_path: Path, asynchronous: bool, direct_io: bool
) -> None:
    state = {"weights": torch.randn(2000, 1500), "bias": torch.randn(7), "step": 3}
    path = tmp_path / "last.ckpt"
    io = DurableCheckpointIO(asynchronous=asynchronous)
    io._tune(direct_io=direct_io)
    io.save_checkpoint(state, path)
    io.teardown()
    assert (cached_pages(path) == 0) == direct_io
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None  # every record's CRC-32 is right
    loaded = DurableCheckpointIO().load_checkpoint(path)
    assert torch.equal(loaded["weights"], state["weights"]) and torch.equal(loaded["bias"], state["bias"])
