"""``PreemptionHandler``'s one state: every transition the module lists, and the ones it refuses (pure)."""

from __future__ import annotations

import itertools
import re
import signal

import pytest

from lightning_resume.preemption import stop_state
from lightning_resume.preemption.stop_state import TRANSITIONS, Event, Stage, StopReport, StopState

S, E = Stage, Event
REPORT = StopReport("SIGTERM", 7)


def test_the_docstring_table_lists_every_transition() -> None:
    """The module's table (``stage event (why) next``) is TRANSITIONS, and nothing more."""
    listed = set()
    for line in (stop_state.__doc__ or "").splitlines():
        found = re.match(r"\s+([A-Z]+)\s+([A-Z]+)\s.*\s([A-Z]+)$", line)
        if found and found.group(1) in Stage.__members__:
            listed.add((S[found.group(1)], E[found.group(2)], S[found.group(3)]))
    assert listed == {(stage, event, following) for (stage, event), following in TRANSITIONS.items()}


@pytest.mark.parametrize(("stage", "event"), list(itertools.product(Stage, Event)))
def test_each_event_moves_as_listed_stays_or_is_refused(stage: Stage, event: Event) -> None:
    state = StopState(stage)
    if event is E.EXIT or stage is S.EXITING:
        assert state.move(event) is S.EXITING  # the interpreter exits: from anywhere, for good
    elif (stage, event) in TRANSITIONS:
        assert state.move(event) is TRANSITIONS[(stage, event)]
    elif event in (E.STOP, E.END):
        with pytest.raises(RuntimeError, match=f"'{event.value}' cannot happen while {stage.value}"):
            state.move(event)
        assert state.stage is stage
    else:
        assert state.move(event) is stage


def test_a_signal_while_training_is_agreed_on_saved_and_ends_fit() -> None:
    state = StopState()
    state.move(E.TRAIN)
    assert state.training and state.signalled(signal.SIGTERM, 5.0) is None
    assert state.stage is S.SIGNALLED and state.signal == (signal.SIGTERM, 5.0)
    assert state.signalled(signal.SIGUSR1, 6.0) == "while already stopping for SIGTERM"  # the first counts
    state.stop(REPORT)
    assert (state.stage, state.report, state.training) == (S.STOPPING, REPORT, False)
    state.move(E.END)
    state.move(E.LEAVE)  # teardown after Preempted: the report stays
    assert state.stage is S.STOPPED and state.report is REPORT


def test_a_signal_before_training_stops_at_once() -> None:
    state = StopState()
    assert state.signalled(signal.SIGTERM, 1.0) is None and state.stage is S.IDLE
    state.stop(StopReport("SIGTERM", None, requeue="disabled"))
    assert state.move(E.END) is S.STOPPED
    assert state.signalled(signal.SIGUSR1, 2.0) == "while already stopping for SIGTERM"


def test_a_notice_stop_keeps_a_later_signal_for_the_requeue_but_not_after_it() -> None:
    state = StopState(S.TRAINING)
    state.stop(StopReport("the aws-spot notice", 3))
    assert REPORT.by_notice is False and state.report is not None and state.report.by_notice
    assert state.signalled(signal.SIGTERM, 1.0) is None and state.stage is S.STOPPING
    state.move(E.END)
    fresh = StopState(S.STOPPED)
    assert fresh.signalled(signal.SIGTERM, 1.0) == "after the stop" and fresh.signal is None


def test_a_signal_pending_at_teardown_stops_the_next_fit_and_exiting_ignores_everything() -> None:
    state = StopState(S.TRAINING)
    state.signalled(signal.SIGTERM, 1.0)
    assert state.move(E.LEAVE) is S.SIGNALLED and state.move(E.TRAIN) is S.SIGNALLED
    state.move(E.EXIT)
    assert state.signalled(signal.SIGTERM, 2.0) == "while the process exits"
    assert state.move(E.TRAIN) is S.EXITING
