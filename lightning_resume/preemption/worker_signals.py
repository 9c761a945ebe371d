"""DataLoader workers and a signal to the whole process group.

SLURM signals every process of a job step, and so does ``kill -- -PGID``. A DataLoader worker forked
by the training process inherits its Python handlers, but torch's worker loop installs C-level
handlers of its own: a SIGTERM from anyone but the worker's parent kills the worker, and the main
process then fails at once ("DataLoader worker ... is killed by signal") instead of stopping cleanly
at the next step boundary. SIGUSR1/SIGUSR2 would run our inherited handler inside the worker.

So, once ``PreemptionHandler`` is installed, a DataLoader worker (and only a worker) forked by this
process blocks the preemption signals, and a daemon thread takes them: it ignores a signal from
anyone else and leaves at once when the parent sends one, which is how ``multiprocessing`` stops a
worker. Other forked children (``multiprocessing`` pools...) keep the normal behaviour.

Recognising a worker at fork time needs one look at the stdlib's ``multiprocessing`` internals (the
process object being launched, in the forking frame): :func:`~lightning_resume._compat.torch.forked_target`.
Workers started with ``spawn`` or ``forkserver`` are not forked from this process and keep torch's
behaviour.
"""

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
    if _IN_THIS_WORKER:
        # A child of a worker gets the normal behaviour back.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _IN_THIS_WORKER)
        _IN_THIS_WORKER = frozenset()
        return
    signals = _BLOCKED.get(os.getppid())
    _BLOCKED.clear()
    if signals and is_worker_loop(forked_target()):
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
