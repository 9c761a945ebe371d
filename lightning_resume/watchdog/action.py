"""What a rank does when its watchdog finds it hung: leave its stacks, tell, requeue once, exit. Runs on the
watchdog thread while the main thread may hold any lock: no logging (fd 2), Lightning or collective."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from lightning_resume.exit_status import records
from lightning_resume.exit_status.records import FailureRecord
from lightning_resume.failure_classes import FailureClass
from lightning_resume.preemption.requeue import requeue_after_hang
from lightning_resume.run_dir import attempts, hangs
from lightning_resume.run_dir.status import RunStatus, write_status
from lightning_resume.watchdog.monitor import Progress

#: Exit status of a rank that hung: a failure to restart (torchrun restarts the group).
HANG_EXIT_CODE = FailureClass.HANG.exit_code
#: Exit status of an attempt stopped because the run keeps failing at the same place: do not requeue.
CRASH_LOOP_EXIT_CODE = FailureClass.CRASH_LOOP.exit_code
#: Seconds a hung rank waits for the other ranks' stacks before it exits.
LINGER_SECONDS = 3.0


@dataclass(frozen=True)
class Who:
    """This rank, as its hang report needs it."""

    rank: int
    world_size: int  # 1 when unknown
    run_dir: Path | None  # None: stacks go to standard error only
    attempt: int | None  # None: worked out from the run dir when needed


def _say(line: str) -> None:
    """One line on standard error, without Python's locks (the main thread may hold one)."""
    with contextlib.suppress(OSError):
        os.write(2, f"lightning_resume: {line}\n".encode(errors="replace"))


def _failed_peer(run_dir: Path, attempt: int, rank: int) -> FailureRecord | None:
    """The first failure of a peer of its own (not a collective's, no hang): this rank waits on it."""
    found = [r for r in records.read(run_dir, attempt) if r.rank != rank and r.original]
    found = [r for r in found if r.failure not in (FailureClass.COMMUNICATION, FailureClass.HANG)]
    return min(found, key=lambda r: r.time, default=None)


def _end_as_peer(who: Who, run_dir: Path, attempt: int, peer: FailureRecord, step: int | None) -> None:
    """Record ``peer``'s failure as this rank's, and (rank 0) as the attempt's end."""
    now, history = time.time(), attempts.read(run_dir)
    records.write(run_dir, replace(peer, rank=who.rank, time=now))
    found = history.get(attempt)
    if who.rank == 0 and found is not None and found.end is None:
        detail, failure = f"failed on rank {peer.cause_rank}: {peer.error}", peer.failure.value
        end = attempts.End(now, attempts.Cause.FAILED, detail, error=peer.error, rank=peer.cause_rank)
        end = replace(end, failure=failure, exit_code=peer.exit_code)
        attempts.write(run_dir, history.with_attempt(replace(found, end=end)))
        write_status(run_dir, RunStatus.FAILED, step, detail)


def act_on_hang(
    who: Who,
    progress: Progress,
    seconds: float,
    environ: Mapping[str, str],
    requeue: bool = True,
    exit_code: int = HANG_EXIT_CODE,
    linger: float = LINGER_SECONDS,
    exit: Callable[[int], NoReturn] = os._exit,
) -> NoReturn:
    """Write this rank's stacks and note, record the hang and requeue once (rank 0), exit with ``exit_code``
    after up to ``linger`` seconds for the peers' notes (their collectives fail once it exits)."""
    at = "before training" if progress.step is None else f"at step {progress.step}"
    late = f"no progress for {seconds:.1f} s (timeout {progress.timeout:.1f} s)"
    what = f"rank {who.rank} hung in {progress.section.label} {at}: {late}"
    stacks_text = "standard error"
    run_dir, attempt = who.run_dir, who.attempt
    try:
        if run_dir is not None:
            if attempt is None:  # a hang before setup, where rank 0 records the number
                attempt = attempts.read(run_dir).next_number(hangs.read_notes(run_dir))
            peer = _failed_peer(run_dir, attempt, who.rank) if who.world_size > 1 else None
            if peer is not None:  # the root cause wins: this rank exits as the failed peer did
                _say(
                    f"ProgressWatchdog: rank {who.rank} made no progress for {seconds:.1f} s waiting on rank "
                    f"{peer.cause_rank}, which failed ({peer.error}); exiting with status {peer.exit_code}"
                )
                _end_as_peer(who, run_dir, attempt, peer, progress.step)
                exit(peer.exit_code)
            stacks = hangs.stacks_path(run_dir, attempt, who.rank)
            header = f"{what}\nattempt {attempt}, pid {os.getpid()} on {socket.gethostname()}"
            hangs.write_stacks(stacks, header)
            stacks_text = str(stacks)
            note = hangs.HangNote(
                attempt=attempt,
                rank=who.rank,
                section=progress.section.value,
                step=progress.step,
                seconds=round(seconds, 3),
                timeout=round(progress.timeout, 3),
                time=time.time(),
                host=socket.gethostname(),
                pid=os.getpid(),
                stacks=str(stacks.relative_to(run_dir)),
            )
            hangs.write_note(run_dir, note)
            # The root cause for the peers whose collectives fail once this rank exits.
            hung = (FailureClass.HANG, exit_code, who.rank, who.rank, attempt, note.time, what)
            records.write(run_dir, FailureRecord(*hung))
            if who.rank == 0:
                detail = f"{what}; stacks: {note.stacks}"
                write_status(run_dir, RunStatus.HUNG, progress.step, detail, {"hang": note.to_dict()})
    except OSError as e:  # the run dir itself may be what hangs or fails: the stacks still go out
        _say(f"could not write the hang report to {str(run_dir)!r}: {e}")
        run_dir = None
    if run_dir is None:
        import faulthandler

        faulthandler.dump_traceback(all_threads=True)
    _say(f"ProgressWatchdog: {what}; stacks: {stacks_text}; exiting with status {exit_code}")
    if run_dir is not None and attempt is not None and who.world_size > 1:
        deadline = time.monotonic() + linger
        while time.monotonic() < deadline and len(hangs.reported_ranks(run_dir, attempt)) < who.world_size:
            time.sleep(0.1)
    if who.rank == 0 and run_dir is not None and attempt is not None:
        with contextlib.suppress(OSError, ValueError):  # else the next attempt closes it from the notes
            notes = [n for n in hangs.read_notes(run_dir) if n.attempt == attempt]
            attempts.write(run_dir, attempts.with_notes(attempts.read(run_dir), notes))
    if who.rank == 0 and requeue:
        _say(f"ProgressWatchdog: requeue: {requeue_after_hang(environ)}")
    exit(exit_code)
