"""DataLoader workers forked after ``PreemptionHandler`` is installed ignore a signal sent to the group.

Pins what ``lightning_resume.preemption.worker_signals`` relies on: the forking frame of
``multiprocessing`` holds the process object, torch's worker loop is recognised, a signal from
another process leaves the workers running, and their parent can still stop them.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _polls import wait_for
from torch.utils.data import DataLoader, Dataset

from lightning_resume.preemption.worker_signals import block_in_workers, unblock_in_workers


class Slow(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.01)
        return torch.tensor(i)


def blocked(pid: int, sig: signal.Signals, field: str = "SigBlk") -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = next(line for line in f if line.startswith(f"{field}:")).split()[1]
    return bool(int(mask, 16) & (1 << (sig - 1)))


def pending(pid: int, sig: signal.Signals) -> bool:
    """Whether ``sig`` waits in process ``pid``, not taken yet (``kill`` makes it pending as it returns)."""
    return blocked(pid, sig, "ShdPnd") or blocked(pid, sig, "SigPnd")


@pytest.fixture
def guarded() -> Iterator[None]:
    parent = os.getpid()

    def survive(signum: int, frame: Any) -> None:
        """The main process survives, as with ours; a forked child gets the default action, as with ours."""
        if os.getpid() != parent:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    previous = signal.signal(signal.SIGTERM, survive)
    block_in_workers([signal.SIGTERM])
    yield
    unblock_in_workers()
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.usefixtures("guarded")
def test_workers_ignore_a_foreign_sigterm_and_their_parent_still_stops_them() -> None:
    iterator: Any = iter(DataLoader(Slow(), batch_size=2, num_workers=2, multiprocessing_context="fork"))
    next(iterator)
    workers = list(iterator._workers)
    assert all(blocked(w.pid, signal.SIGTERM) for w in workers)
    # From another process, as slurmstepd sends it: torch's own worker handler would die of it.
    subprocess.run(["kill", "-s", "TERM", *(str(w.pid) for w in workers)], check=True)
    assert wait_for(lambda: not any(pending(w.pid, signal.SIGTERM) for w in workers))  # taken, and...
    assert all(w.is_alive() for w in workers)
    for _ in range(5):
        next(iterator)  # and they still serve batches
    for w in workers:  # what multiprocessing does at exit: the parent's SIGTERM still ends them
        w.terminate()
        w.join(timeout=30)
    assert not any(w.is_alive() for w in workers)


def started_then_sleep(started: Any) -> None:
    started.set()
    time.sleep(60)


@pytest.mark.usefixtures("guarded")
def test_other_forked_children_keep_the_normal_behaviour() -> None:
    context = multiprocessing.get_context("fork")
    started = context.Event()
    child = context.Process(target=started_then_sleep, args=(started,), daemon=True)
    child.start()
    try:
        assert started.wait(60)  # past the at-fork hook, which would have blocked the signal by now
        assert not blocked(child.pid, signal.SIGTERM)  # type: ignore[arg-type]
    finally:
        # SIGKILL: the child inherits the fixture's Python-level SIGTERM handler, which a child forked
        # from a threaded process (an xdist worker) can be kept from ever running by a lock another
        # thread held at the fork; a multiprocessing Pool's terminate() once waited on it for good.
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(timeout=30)


def test_nothing_is_blocked_once_uninstalled() -> None:
    block_in_workers([signal.SIGTERM])
    unblock_in_workers()
    iterator: Any = iter(DataLoader(Slow(), batch_size=2, num_workers=1, multiprocessing_context="fork"))
    next(iterator)
    assert not blocked(iterator._workers[0].pid, signal.SIGTERM)
    del iterator
