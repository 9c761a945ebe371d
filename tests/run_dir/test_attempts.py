"""The attempt history (``attempts.json``): what each attempt's ending was, and the crash-loop rule."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from lightning_resume.run_dir import attempts, hangs
from lightning_resume.run_dir.attempts import Attempt, Cause, Checkpoint, End, History
from lightning_resume.run_dir.hangs import HangNote
from lightning_resume.watchdog import crash_loop


def attempt(number: int, **fields: object) -> Attempt:
    return Attempt(number, "node", 100 + number, None, started=1000.0 * number, **fields)  # type: ignore[arg-type]


def ended(number: int, cause: Cause, start: int | None, end: int | None, **fields: object) -> Attempt:
    """An attempt that started from checkpoint ``start`` and ended with ``end`` as the newest one."""
    return attempt(
        number,
        checkpoint_at_start=Checkpoint(start, 1.0) if start is not None else None,
        checkpoint=Checkpoint(end, 2.0) if end is not None else None,
        end=End(1000.0 * number + 500, cause, f"{cause.value} in attempt {number}"),
        **fields,
    )


def note(attempt: int, rank: int, time: float, section: str = "step", step: int | None = 7) -> HangNote:
    return HangNote(
        attempt, rank, section, step, 12.0, 10.0, time, "node", 9, f"hangs/attempt-{attempt}-rank-{rank}.txt"
    )


def test_a_restart_closes_the_open_record_as_killed_with_the_checkpoint_it_left() -> None:
    history = History(attempts=(attempt(1, last_step=9, last_step_time=1400.0),))
    now = Checkpoint(8, 1390.0)
    history = attempts.begin(history, attempt(2), now)
    first, second = history.attempts
    assert first.end is not None and first.end.cause is Cause.KILLED and first.end.time == 1400.0
    assert first.checkpoint == now and first.made_progress
    assert second.checkpoint_at_start == now and second.end is None
    assert history.next_number() == 3


def test_hang_notes_make_an_attempt_hung_even_when_a_peer_recorded_a_failure() -> None:
    failed = ended(1, Cause.FAILED, None, None)
    notes = [note(1, rank=1, time=1200.0), note(1, rank=0, time=1200.5, section="save")]
    history = attempts.with_notes(History(attempts=(failed,)), notes)
    end = history.attempts[0].end
    assert end is not None and end.cause is Cause.HUNG
    assert (end.rank, end.section, end.step, end.seconds) == (1, "step", 7, 12.0)  # the first to report
    assert end.stacks == ("hangs/attempt-1-rank-0.txt", "hangs/attempt-1-rank-1.txt")
    assert "hung in training step at step 7" in end.detail and "hangs/attempt-1-rank-1.txt" in end.detail


def test_a_start_up_hang_before_rank_0_recorded_the_attempt_gets_a_record() -> None:
    history = History(attempts=(ended(1, Cause.PREEMPTED, None, 4),))
    notes = [note(2, rank=0, time=5000.0, section="startup", step=None)]
    assert History(attempts=history.attempts).next_number(notes) == 3
    history = attempts.begin(history, attempt(3), Checkpoint(4, 2.0), notes)
    hung = history.get(2)
    assert hung is not None and hung.end is not None and hung.end.cause is Cause.HUNG
    assert hung.checkpoint_at_start == hung.checkpoint == Checkpoint(4, 2.0) and not hung.made_progress
    assert [a.number for a in history.attempts] == [1, 2, 3]


def test_crash_loop_counts_attempts_in_a_row_without_a_new_checkpoint() -> None:
    history = History(
        attempts=(
            ended(1, Cause.FAILED, None, 4),  # made a checkpoint: not in the loop
            ended(2, Cause.FAILED, 4, 4),
            ended(3, Cause.HUNG, 4, 4),
            attempt(4, checkpoint_at_start=Checkpoint(4, 2.0), checkpoint=Checkpoint(4, 2.0)),  # killed
        )
    )
    assert [a.number for a in crash_loop.without_progress(history)] == [2, 3, 4]
    assert [a.number for a in crash_loop.without_progress(history, before=4)] == [2, 3]
    line = crash_loop.describe_streak(crash_loop.without_progress(history, before=4))
    assert line.startswith("attempts 2-3 started from step 4") and "hung in attempt 3" in line


def test_a_finished_or_preempted_attempt_or_a_reset_ends_the_loop() -> None:
    for breaker in (Cause.FINISHED, Cause.PREEMPTED):
        history = History(
            attempts=(ended(1, Cause.FAILED, 4, 4), ended(2, breaker, 4, 4), ended(3, Cause.FAILED, 4, 4))
        )
        assert [a.number for a in crash_loop.without_progress(history)] == [3]
    history = History(attempts=(ended(1, Cause.FAILED, 4, 4), ended(2, Cause.FAILED, 4, 4)))
    assert crash_loop.without_progress(crash_loop.reset(history)) == []
    again = history.with_attempt(ended(3, Cause.FAILED, 4, 4))
    assert [a.number for a in crash_loop.without_progress(replace(again, reset_after=2))] == [3]


def test_the_file_keeps_the_last_attempts_and_sums_up_the_others(tmp_path: Path) -> None:
    history = History(
        attempts=tuple(ended(n, Cause.PREEMPTED, n - 1, n) for n in range(1, attempts.KEEP + 11))
    )
    seconds, interruptions = attempts.exposure(history)
    attempts.write(tmp_path, history)
    back = attempts.read(tmp_path)
    assert len(back.attempts) == attempts.KEEP and back.attempts[0].number == 11
    assert back.earlier.attempts == 10 and back.earlier.causes == {"preempted": 10}
    assert (
        attempts.exposure(back)
        == (seconds, interruptions)
        == (500.0 * (attempts.KEEP + 10), attempts.KEEP + 10)
    )
    assert back.next_number() == attempts.KEEP + 11
    assert back.attempts == history.attempts[10:]  # every field read back as written


def test_an_unreadable_history_reads_as_empty(tmp_path: Path) -> None:
    (tmp_path / "attempts.json").write_text("{garbage")
    assert attempts.read(tmp_path) == History()
    (tmp_path / "attempts.json").write_text(json.dumps({"attempts": [{"no": "number"}]}))
    assert attempts.read(tmp_path) == History()


def test_hang_notes_round_trip_and_prune(tmp_path: Path) -> None:
    for n in (1, 2):
        hangs.write_note(tmp_path, note(n, rank=0, time=float(n)))
        hangs.stacks_path(tmp_path, n, 0).write_text("stacks")
    assert hangs.read_notes(tmp_path) == [note(1, 0, 1.0), note(2, 0, 2.0)]
    assert hangs.reported_ranks(tmp_path, 2) == {0}
    hangs.prune(tmp_path, keep={2})
    assert sorted(p.name for p in (tmp_path / "hangs").iterdir()) == [
        "attempt-2-rank-0.json",
        "attempt-2-rank-0.txt",
    ]


def test_a_file_without_the_restart_fields_still_loads_and_a_new_one_round_trips(tmp_path: Path) -> None:
    old = {"attempt": 2, "host": "node", "pid": 7, "launch": None, "started": 1000.0, "first_step": 1010.0}
    end = {"time": 1100.0, "cause": "preempted", "detail": "preempted by SIGTERM", "signal": "SIGTERM"}
    (tmp_path / "attempts.json").write_text(json.dumps({"version": 1, "attempts": [{**old, "end": end}]}))
    (read,) = attempts.read(tmp_path).attempts
    assert (read.code_started, read.restore, read.restored_at, read.exited) == (None, None, None, None)
    assert read.end is not None and read.end.signalled is None and read.end.fault == 1100.0
    assert not {"code_started", "restore", "restored_at", "exited"} & attempts.attempt_to_dict(read).keys()

    restore = {"tier": "durable", "path": "last.ckpt", "bytes": 5_000_000, "seconds": 1.5, "started": 1005.0}
    signalled = End(1100.0, Cause.PREEMPTED, "preempted by SIGTERM", signal="SIGTERM", signalled=1090.0)
    new = replace(
        read, code_started=1002.0, restore=restore, restored_at=1006.5, exited=1104.0, end=signalled
    )
    attempts.write(tmp_path, History(attempts=(new,)))
    assert attempts.read(tmp_path).attempts == (new,)


def test_the_fault_is_the_signal_a_hangs_last_progress_or_the_end() -> None:
    assert End(100.0, Cause.PREEMPTED, "", signal="SIGTERM", signalled=90.0).fault == 90.0
    assert End(100.0, Cause.HUNG, "", seconds=30.0).fault == 70.0  # the watchdog waited 30 s to tell
    assert End(100.0, Cause.KILLED, "").fault == 100.0  # its last step beat
    assert End(100.0, Cause.FAILED, "", error="RuntimeError: boom").fault == 100.0
