"""The failure classes' table: statuses clear of the shell's and of signals', the retryable ones the issue
names, the existing statuses (143, 75, 93) routed through it, and the docs page showing the same table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_resume import PreemptionHandler, ProgressWatchdog
from lightning_resume.failure_classes import TABLE, FailureClass, by_exit_code, ending, exit_codes

PAGE = Path(__file__).resolve().parents[1] / "docs" / "src" / "failure_classes.md"


def test_every_status_is_its_own_and_clear_of_the_shell_and_of_signals() -> None:
    codes = [f.exit_code for f in FailureClass]
    assert len(set(codes)) == len(codes)
    reserved = {0, 1, 2, 126, 127, *range(128, 256)} - {FailureClass.PREEMPTED.exit_code}
    assert not reserved & set(codes)
    assert all(by_exit_code(f.exit_code) is f for f in FailureClass)


def test_preemption_hang_communication_and_out_of_memory_are_the_retryable_ones() -> None:
    retryable = {f for f in FailureClass if f.retryable}
    assert retryable == {
        FailureClass.PREEMPTED,
        FailureClass.HANG,
        FailureClass.COMMUNICATION,
        FailureClass.OUT_OF_MEMORY,
    }
    assert exit_codes(True) == sorted(f.exit_code for f in retryable)
    assert 137 not in exit_codes(True) + exit_codes(False)


def test_the_statuses_the_callbacks_already_used_stay_and_come_from_the_table() -> None:
    assert (FailureClass.PREEMPTED.exit_code, FailureClass.HANG.exit_code) == (143, 75)
    assert FailureClass.CRASH_LOOP.exit_code == 93
    assert PreemptionHandler(notices=None).exit_code == FailureClass.PREEMPTED.exit_code
    watchdog = (ProgressWatchdog.HANG_EXIT_CODE, ProgressWatchdog.CRASH_LOOP_EXIT_CODE)
    assert watchdog == (FailureClass.HANG.exit_code, FailureClass.CRASH_LOOP.exit_code)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("out-of-memory", 1, 71, True), "out of memory on rank 1, exit 71, retried"),
        (("data", 0, 66, False), "data loading error on rank 0, exit 66, not retryable"),
        (("hang", None, None, False), "hang, retryable"),
        (("from-the-future", 2, 99, False), "from-the-future on rank 2, exit 99"),
    ],
)
def test_an_ending_in_words(args: tuple[str, int | None, int | None, bool], words: str) -> None:
    assert ending(*args) == words


def test_the_docs_page_shows_the_table_of_the_module() -> None:
    rows = re.findall(r"^\| `([a-z-]+)` \| (\d+) \| (yes|no) \|", PAGE.read_text(), re.MULTILINE)
    shown = {name: (int(code), retry == "yes") for name, code, retry in rows}
    assert shown == {f.value: (row.exit_code, row.retryable) for f, row in TABLE.items()}


@pytest.mark.parametrize("callback", [PreemptionHandler, ProgressWatchdog])
def test_the_switch_is_a_flag_named_in_the_error(callback: type) -> None:
    with pytest.raises(TypeError, match="failure_classes"):
        callback(failure_classes="no")
    assert callback(failure_classes=False).failure_classes is False
