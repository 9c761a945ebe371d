"""The writer's duty cycle: gentle writes rest between work periods, a hurry message lifts the pacing.

Real pipes, the writer's own reads; no clock is asserted: what is checked is whether the write rests
(it waits for the disk, then sleeps) and when it stops resting.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import pytest

from lightning_resume._storage.writer import DutyCycle, hurry
from lightning_resume.io.write_stats import WriteStats


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    yield read, write
    for fd in (read, write):
        with contextlib.suppress(OSError):  # a test may have closed it
            os.close(fd)


class Disk:
    """The ``drain`` a ``DirectFile`` passes: counts how often the write waited for the disk to rest."""

    def __init__(self) -> None:
        self.rests = 0

    def drain(self) -> None:
        self.rests += 1


def test_a_gentle_write_rests_after_each_work_period(pipe: tuple[int, int]) -> None:
    pace, disk = DutyCycle(0.99, pipe[0], seq=1, quantum=0.0), Disk()
    for _ in range(3):
        pace.after_block(100, disk.drain)
    assert disk.rests == 3 and pace.gentle
    stats = WriteStats(**pace.stats(300))
    assert (stats.share, stats.hurried_after, stats.nbytes) == (0.99, None, 300)


def test_full_speed_never_rests(pipe: tuple[int, int]) -> None:
    pace, disk = DutyCycle(1.0, pipe[0], seq=1, quantum=0.0), Disk()
    for _ in range(3):
        pace.after_block(100, disk.drain)
    assert disk.rests == 0 and not pace.gentle and pace.stats(300)["hurried_after"] is None


def test_a_hurry_message_for_this_write_lifts_the_pacing(pipe: tuple[int, int]) -> None:
    read, write = pipe
    pace, disk = DutyCycle(0.99, read, seq=7, quantum=0.0), Disk()
    pace.after_block(100, disk.drain)
    hurry(write, 6)  # for the previous write: stale
    pace.after_block(100, disk.drain)
    assert pace.gentle and disk.rests == 2
    hurry(write, 7)
    pace.after_block(100, disk.drain)
    pace.after_block(100, disk.drain)
    assert not pace.gentle and disk.rests == 2
    assert pace.stats(400)["hurried_after"] == 300


def test_a_hurry_ends_a_rest_at_once(pipe: tuple[int, int]) -> None:
    read, write = pipe

    class SlowDisk(Disk):
        def drain(self) -> None:
            super().drain()
            threading.Event().wait(0.02)  # the work period lasts >= 20 ms: the rest ~ 20 ms / 1e-6

    pace, disk = DutyCycle(1e-6, read, seq=1, quantum=0.0), SlowDisk()
    resting = threading.Thread(target=pace.after_block, args=(100, disk.drain), daemon=True)
    resting.start()
    while disk.rests == 0:
        threading.Event().wait(0.001)
    hurry(write, 1)
    resting.join(timeout=60)  # about 20000 s of rest otherwise
    assert not resting.is_alive() and not pace.gentle
    assert pace.stats(100)["hurried_after"] == 100


def test_the_trainer_gone_means_full_speed(pipe: tuple[int, int]) -> None:
    read, write = pipe
    pace, disk = DutyCycle(0.5, read, seq=1, quantum=0.0), Disk()
    pace.after_block(100, disk.drain)
    os.close(write)  # the trainer died: end of file
    pace.after_block(100, disk.drain)
    assert not pace.gentle and disk.rests == 1


def test_hurry_never_blocks_on_a_full_or_closed_pipe(pipe: tuple[int, int]) -> None:
    read, write = pipe
    for seq in range(20_000):  # far more than a pipe holds
        hurry(write, seq)
    os.close(read)
    hurry(write, 1)  # no reader: ignored


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_share_must_be_a_fraction(share: float) -> None:
    with pytest.raises(ValueError, match="share"):
        DutyCycle(share)


def test_stats_cross_the_pipe_as_fields_and_give_the_speed() -> None:
    stats = WriteStats(**DutyCycle(0.5).stats(1000, fsync_seconds=0.25))
    assert (stats.nbytes, stats.share, stats.fsync_seconds, stats.hurried_after) == (1000, 0.5, 0.25, None)
    assert WriteStats(nbytes=1000, seconds=2.0).bytes_per_second == 500.0
