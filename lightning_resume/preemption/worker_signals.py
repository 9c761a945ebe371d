"""A preemption signal to the whole process group (SLURM) kills torch's DataLoader workers, failing ``fit``:
while ``PreemptionHandler`` is installed a forked worker blocks them and exits on the parent's only."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable

from lightning_resume._compat.torch import forked_target, is_worker_loop

_BLOCKED: dict[int, frozenset[int]] = {}  # installing pid -> the signals its workers hold back
_IN_THIS_WORKER: frozenset[int] = frozenset()  # set in a worker whose signals are held back
_REGISTERED = False


def _wait_for_parent(signals: frozenset[int]) -> None:
    """In a worker: take the held-back signals; leave only when the parent sent one."""
    parent = os.getppid()
    while True:
        if signal.sigwaitinfo(signals).si_pid == parent:
            os._exit(0)


def _after_fork_in_child() -> None:
    global _IN_THIS_WORKER
    if _IN_THIS_WORKER:  # a child of a worker gets the normal behaviour back
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _IN_THIS_WORKER)
        _IN_THIS_WORKER = frozenset()
        return
    signals = _BLOCKED.get(os.getppid())
    _BLOCKED.clear()
    if signals and is_worker_loop(forked_target()):  # only a worker: spawn/forkserver keep torch's way
        # Blocked in every thread of the worker, so torch's handler never runs; a thread takes them.
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        _IN_THIS_WORKER = signals
        threading.Thread(target=_wait_for_parent, args=(signals,), name="signal-guard", daemon=True).start()


def block_in_workers(signals: Iterable[signal.Signals]) -> None:
    """From now on, DataLoader workers forked by this process ignore ``signals`` sent by others."""
    global _REGISTERED
    if not _REGISTERED:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _REGISTERED = True
    _BLOCKED[os.getpid()] = frozenset(int(s) for s in signals)


def unblock_in_workers() -> None:
    """Workers forked from now on get signals as usual."""
    _BLOCKED.pop(os.getpid(), None)
