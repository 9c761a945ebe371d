"""The ``"auto"`` checkpoint interval: Young/Daly from the measured save stall and the run's own history,
its bounds, its prior and its hysteresis; and the save times and choices the attempt history keeps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lightning_resume._run import attempts, cadence
from lightning_resume._run.attempts import Attempt, Beat, Cause, Checkpoint, End, History, LastCkptSaves
from lightning_resume._run.cadence import Bound, Interruptions, Measurements, PriorSource
from lightning_resume.notices._policy import DEFAULT_SECONDS_TO_DURABLE, expected_seconds_to_durable

DAY = 86400.0


def run_of(*endings: tuple[Cause, int, int | None], seconds: float = 100.0) -> History:
    """A history written through the attempts module: each attempt runs ``seconds``, trains to its
    ``last_step``, leaves ``checkpoint`` as the newest durable one and ends as told."""
    history = History()
    for number, (cause, last_step, checkpoint) in enumerate(endings, start=1):
        start = number * 1000.0
        saved = Checkpoint(checkpoint, start + 1) if checkpoint is not None else None
        history = attempts.begin(history, Attempt(number, "node", number, None, started=start), saved)
        end = End(start + seconds, cause, cause.value)
        history = history.with_attempt(
            Attempt(
                number, "node", number, None, started=start, last_step=last_step, checkpoint=saved, end=end
            )
        )
    return history


def interval(history: History, now: float, prior_seconds: float = DAY) -> int:
    """The steps ``"auto"`` chooses for a 2 s save stall and 0.5 s steps."""
    seen = cadence.interruptions(history, now)
    between = cadence.time_between_interruptions(seen, cadence.prior(prior_seconds))
    return cadence.choose(Measurements(2.0, 2.0, 0.5), between).steps


def test_more_interruptions_in_the_history_choose_a_shorter_interval() -> None:
    calm = run_of((Cause.PREEMPTED, 40, 40), (Cause.FINISHED, 80, 80))
    one_kill = run_of((Cause.KILLED, 40, 30), (Cause.FINISHED, 80, 80))
    kills = run_of(
        (Cause.KILLED, 40, 30), (Cause.KILLED, 70, 60), (Cause.KILLED, 90, 80), (Cause.FAILED, 95, 90)
    )
    now = 10_000.0
    # The graceful preemption saved its last step: it lost nothing and does not count.
    assert cadence.interruptions(calm, now).count == 0
    assert cadence.interruptions(one_kill, now).count == 1
    assert cadence.interruptions(kills, now).count == 4
    assert interval(kills, now) < interval(one_kill, now) < interval(calm, now)
    # 4 interruptions in 400 s (killed attempts end at their step beat): 100 s between them.
    seen = cadence.interruptions(kills, now)
    between = cadence.time_between_interruptions(seen, cadence.prior())
    assert (between.source, between.seconds) == ("history", 100.0)
    assert cadence.choose(Measurements(2.0, 2.0, 0.5), between).steps == 40  # sqrt(2 x 2 x 100) = 20 s


def test_the_running_attempt_counts_until_now_and_a_long_calm_outgrows_the_prior() -> None:
    running = History(attempts=(Attempt(1, "node", 1, None, started=0.0),))
    assert cadence.interruptions(running, now=500.0) == Interruptions(500.0, 0, 1)
    short_prior = cadence.prior(user_seconds=100.0)
    between = cadence.time_between_interruptions(cadence.interruptions(running, 500.0), short_prior)
    assert (between.seconds, between.source) == (500.0, "history")
    early = cadence.time_between_interruptions(cadence.interruptions(running, 50.0), short_prior)
    assert (early.seconds, early.source) == (100.0, "user")


def test_young_daly_and_its_bounds() -> None:
    def choose(stall: float, durable: float, step: float, between: float) -> cadence.Choice:
        return cadence.choose(Measurements(stall, durable, step), cadence.Between(between, "user", "given"))

    plain = choose(stall=2.0, durable=2.0, step=0.5, between=3600.0)
    assert plain.young_daly == pytest.approx(math.sqrt(2 * 2.0 * 3600.0)) and plain.bound is None
    assert plain.steps == math.ceil(120 / 0.5) and plain.seconds == pytest.approx(120.0)
    # A background write that takes longer than the interval: never two saves in flight.
    slow_write = choose(stall=0.01, durable=30.0, step=0.5, between=3600.0)
    assert (slow_write.bound, slow_write.steps) == (Bound.TO_DURABLE, 60)
    # A save more costly than half the time between interruptions: once per interruption (Daly).
    costly = choose(stall=100.0, durable=100.0, step=1.0, between=150.0)
    assert (costly.bound, costly.steps) == (Bound.BETWEEN, 150)
    # Steps longer than the interval: every step.
    tiny = choose(stall=0.001, durable=0.001, step=10.0, between=60.0)
    assert (tiny.bound, tiny.steps) == (Bound.ONE_STEP, 1)
    assert "every 240 steps" in plain.describe() and "sqrt(2 x 2 s save stall x 60.0 min" in plain.describe()
    assert "raised to the 30 s a save takes to be durable" in slow_write.describe()


def test_the_prior_is_the_users_else_the_shortest_of_scheduler_machine_and_a_day() -> None:
    assert cadence.prior().seconds == DAY and cadence.prior().source is PriorSource.DEFAULT
    assert cadence.prior(cloud="aws").source is PriorSource.CLOUD
    assert cadence.prior(time_limit_seconds=7200.0, cloud="gce").source is PriorSource.SLURM_TIME_LIMIT
    assert cadence.prior(user_seconds=5 * DAY, time_limit_seconds=60.0).seconds == 5 * DAY
    show_job = "JobId=7 JobName=x TimeLimit=1-02:30:00 TimeMin=N/A"
    assert cadence.parse_time_limit(show_job) == DAY + 2.5 * 3600
    assert cadence.parse_time_limit("TimeLimit=30") == 1800.0
    assert cadence.parse_time_limit("TimeLimit=05:00") == 300.0
    assert cadence.parse_time_limit("TimeLimit=UNLIMITED") is None
    env = {"SLURM_JOB_START_TIME": "1000", "SLURM_JOB_END_TIME": "4600"}
    assert cadence.slurm_time_limit(env, show_job) == 3600.0
    assert cadence.slurm_time_limit({}, show_job) == DAY + 2.5 * 3600
    assert cadence.slurm_time_limit({}, None) is None


def test_a_new_interval_replaces_the_current_one_only_beyond_the_hysteresis() -> None:
    assert cadence.material(None, 7)
    assert not cadence.material(100, 124) and not cadence.material(100, 81)
    assert cadence.material(100, 126) and cadence.material(100, 79)


def test_save_times_choices_and_endings_round_trip_through_attempts_json(tmp_path: Path) -> None:
    times = LastCkptSaves().stalled(0.5).stalled(1.5).durable(4.0).durable(3.0)
    choice = cadence.choose(Measurements(1.5, 4.0, 0.25), cadence.Between(600.0, "history", "2 in 20 min"))
    attempt = Attempt(
        1,
        "node",
        5,
        None,
        started=1.0,
        last_ckpt_saves=times,
        cadence=choice.to_dict(),
        end=End(
            9.0, Cause.PREEMPTED, "preempted by SIGTERM after a file notice", signal="SIGTERM", notice="file"
        ),
    )
    attempts.write(tmp_path, History(attempts=(attempt,)))
    back = attempts.read(tmp_path)
    (read,) = back.attempts
    assert read.last_ckpt_saves == LastCkptSaves(2, 2.0, 1.5, 1.5, 2, 4.0, 3.0)
    assert read.end is not None and (read.end.signal, read.end.notice) == ("SIGTERM", "file")
    chosen = cadence.choice_from_dict(attempts.last_cadence(back) or {})
    assert chosen is not None and chosen.describe() == choice.describe() and chosen.steps == choice.steps
    assert attempts.recorded_to_durable(tmp_path) == 4.0


def test_the_notice_deadline_uses_the_recorded_time_to_durable_before_measuring_one() -> None:
    assert expected_seconds_to_durable(None, None) == DEFAULT_SECONDS_TO_DURABLE
    assert expected_seconds_to_durable(None, None, recorded=4.0) == 4.0
    assert expected_seconds_to_durable(2.0, None, recorded=4.0) == 2.0  # this attempt's own measurement


def test_a_killed_attempt_ends_at_its_step_beat_when_the_beat_is_its_own(tmp_path: Path) -> None:
    (tmp_path / attempts.BEAT).write_bytes(attempts.beat_line(Beat(1, 57, 1234.5)))
    beat = attempts.read_beat(tmp_path)
    assert beat == Beat(1, 57, 1234.5)
    open_record = History(
        attempts=(Attempt(1, "node", 1, None, started=1000.0, last_step=3, last_step_time=1001.0),)
    )
    closed = attempts.begin(
        open_record, Attempt(2, "node", 2, None, started=1300.0), Checkpoint(50, 1200.0), beat=beat
    )
    first = closed.attempts[0]
    assert first.end is not None and (first.end.cause, first.end.step, first.end.time) == (
        Cause.KILLED,
        57,
        1234.5,
    )
    assert first.last_step == 57
    stale = attempts.begin(
        open_record, Attempt(2, "node", 2, None, started=1300.0), None, beat=Beat(9, 1, 0.0)
    )
    assert stale.attempts[0].end is not None and stale.attempts[0].end.step is None  # another attempt's beat
