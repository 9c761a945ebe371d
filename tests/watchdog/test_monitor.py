"""The watchdog thread, its learned timeouts and what a hung rank leaves behind (no Lightning)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import NoReturn

import pytest
from _polls import wait_for
from conftest import job_env

from lightning_resume.run_dir import hangs, layout
from lightning_resume.run_dir.hangs import Section
from lightning_resume.run_dir.status import read_status
from lightning_resume.watchdog.action import HANG_EXIT_CODE, Who, act_on_hang
from lightning_resume.watchdog.monitor import Progress, Watchdog
from lightning_resume.watchdog.timeouts import Timeouts, WatchdogTimeouts, read_slowest, write


def test_a_learned_timeout_is_a_multiple_of_the_slowest_time_seen_never_below_the_floor() -> None:
    timeouts = Timeouts(WatchdogTimeouts(save=7.0, multiple=5.0, minimum=2.0, initial=99.0))
    assert timeouts.timeout(Section.STEP) == 99.0  # nothing seen yet
    timeouts.observe(Section.STEP, 0.1)
    assert timeouts.timeout(Section.STEP) == 2.0
    assert timeouts.observe(Section.STEP, 1.0) and not timeouts.observe(Section.STEP, 0.5)
    assert timeouts.timeout(Section.STEP) == 5.0
    timeouts.observe(Section.SAVE, 100.0)
    assert timeouts.timeout(Section.SAVE) == 7.0  # given, never learned


def test_the_next_attempt_starts_with_the_times_this_one_saw(tmp_path: Path) -> None:
    seen = Timeouts(WatchdogTimeouts(minimum=1.0))
    seen.observe(Section.VALIDATION, 3.0)
    write(tmp_path, seen, crash_loop_limit=3)
    following = Timeouts(WatchdogTimeouts(minimum=1.0))
    following.merge(read_slowest(tmp_path))
    assert following.timeout(Section.VALIDATION) == 15.0
    data = json.loads((tmp_path / layout.WATCHDOG).read_text())
    assert data["timeouts"]["validation"] == 15.0 and data["max_attempts_without_progress"] == 3


class Fired:
    def __init__(self) -> None:
        self.calls: list[tuple[Progress, float]] = []
        self.event = threading.Event()

    def __call__(self, progress: Progress, seconds: float) -> None:
        self.calls.append((progress, seconds))
        self.event.set()


def test_the_thread_fires_while_the_main_thread_is_blocked_in_c() -> None:
    fired = Fired()
    dog = Watchdog(fired, poll=0.05, backstop=False)
    dog.start()
    try:
        dog.report(Progress(Section.STEP, 3, time.monotonic(), timeout=0.3))
        assert fired.event.wait(60)  # blocked in C (a lock's wait), holding nothing: the thread still runs
        ((progress, seconds),) = fired.calls
        assert progress.section is Section.STEP and progress.step == 3 and seconds >= 0.3
    finally:
        dog.stop()


class Looks:
    """An ``until`` that never holds and counts the thread's looks at the progress it belongs to."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> bool:
        self.count += 1
        return False


def test_progress_keeps_it_quiet_and_until_ends_the_watch() -> None:
    fired, looks = Fired(), Looks()
    dog = Watchdog(fired, poll=0.05, backstop=False)
    dog.start()
    try:
        # Progress every 0.05 s of a 0.3 s timeout, until the thread has looked 20 times (a second or more).
        deadline = time.monotonic() + 60
        while looks.count < 20 and time.monotonic() < deadline:
            dog.report(Progress(Section.STEP, 1, time.monotonic(), timeout=0.3, until=looks))
            time.sleep(0.05)
        assert looks.count >= 20 and not fired.calls
        done = threading.Event()
        dog.report(Progress(Section.TEARDOWN, 1, time.monotonic(), timeout=0.3, until=done.is_set))
        done.set()
        assert wait_for(lambda: not dog.alive, 60)  # the thread ends by itself: nothing left to watch
        assert not fired.calls
    finally:
        dog.stop()


class Exited(Exception):
    pass


def _raise(code: int) -> NoReturn:
    raise Exited(code)


def test_a_hung_rank_writes_its_stacks_and_note_and_rank_0_records_the_hang(tmp_path: Path) -> None:
    # Rank 1 reported already: rank 0 does not wait out the linger.
    hangs.write_note(tmp_path, hangs.HangNote(4, 1, "step", 7, 9.0, 8.0, time.time(), "node", 1, "x"))
    progress = Progress(Section.SAVE, 7, time.monotonic() - 9.0, timeout=8.0)
    with pytest.raises(Exited) as exited:
        act_on_hang(Who(0, 2, tmp_path, 4), progress, 9.0, {}, linger=30.0, exit=_raise)
    assert exited.value.args == (HANG_EXIT_CODE,)
    stacks = hangs.stacks_path(tmp_path, 4, 0).read_text()
    assert stacks.startswith(
        "rank 0 hung in checkpoint save at step 7: no progress for 9.0 s (timeout 8.0 s)"
    )
    assert "test_a_hung_rank_writes_its_stacks" in stacks  # this (the main) thread's stack
    (mine,) = [n for n in hangs.read_notes(tmp_path) if n.rank == 0]
    assert (mine.attempt, mine.section, mine.step, mine.stacks) == (
        4,
        "save",
        7,
        "hangs/attempt-4-rank-0.txt",
    )
    status = read_status(tmp_path)
    assert status["status"] == "hung" and status["step"] == 7 and status["hang"]["section"] == "save"


def test_when_c_code_holds_the_gil_the_backstop_dumps_and_exits(tmp_path: Path) -> None:
    # re's matcher never releases the GIL: no Python thread runs while it backtracks.
    script = textwrap.dedent(
        """
        import os, re, time
        from lightning_resume.watchdog.monitor import Backstop, Progress, Watchdog
        from lightning_resume.run_dir.hangs import Section
        Backstop.MARGIN = 1.0
        dog = Watchdog(lambda progress, seconds: os._exit(75), poll=0.05)
        dog.start()
        dog.report(Progress(Section.STEP, 1, time.monotonic(), timeout=0.5))
        re.match(r"(a+)+$", "a" * 64 + "b")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=job_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stderr  # faulthandler's exit, not the Python watchdog's 75
    assert "Timeout (0:00:0" in proc.stderr and 'File "<string>", line 9' in proc.stderr


def test_the_stacks_go_to_stderr_when_the_run_dir_cannot_be_written(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from lightning_resume.watchdog.monitor import Progress
        from lightning_resume.watchdog.action import Who, act_on_hang
        from lightning_resume.run_dir.hangs import Section
        progress = Progress(Section.STEP, 2, time.monotonic(), 1.0)
        act_on_hang(Who(0, 1, Path({str(blocked)!r}), 1), progress, 1.5, {{}})
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=job_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == HANG_EXIT_CODE
    assert "could not write the hang report" in proc.stderr and "Current thread" in proc.stderr
    assert "stacks: standard error" in proc.stderr
    assert os.path.isfile(blocked)
