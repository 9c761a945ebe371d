"""The ``"auto"`` checkpoint interval: Young/Daly from the measured save stall and the run's own history,
its bounds, its prior and its hysteresis; and the save times and choices the attempt history keeps."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from lightning_resume.last_ckpt import auto_cadence as cadence
from lightning_resume.last_ckpt.auto_cadence import Bound, Interruptions, Measurements, PriorSource
from lightning_resume.preemption.notices._policy import (
    DEFAULT_SECONDS_TO_DURABLE,
    expected_seconds_to_durable,
)
from lightning_resume.run_dir import attempts
from lightning_resume.run_dir.attempts import (
    Attempt,
    Beat,
    Cause,
    Checkpoint,
    End,
    History,
    LastCkptSaves,
    Stalls,
)

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


def interval(history: History, now: float) -> int:
    """The steps ``"auto"`` chooses for a 2 s save stall and 0.5 s steps (the default prior: a day)."""
    seen = cadence.interruptions(history, now)
    between = cadence.time_between_interruptions(seen, cadence.prior())
    return cadence.choose(Measurements(2.0, 2.0, 0.5), between).steps


def test_more_interruptions_in_the_history_choose_a_shorter_interval() -> None:
    calm = run_of((Cause.FINISHED, 80, 80))
    one_kill = run_of((Cause.KILLED, 40, 30), (Cause.FINISHED, 80, 80))
    kills = run_of(
        (Cause.KILLED, 40, 30), (Cause.KILLED, 70, 60), (Cause.KILLED, 90, 80), (Cause.FAILED, 95, 90)
    )
    now = 10_000.0
    assert cadence.interruptions(calm, now) == Interruptions(100.0, 0, 1, 0)
    assert cadence.interruptions(one_kill, now) == Interruptions(200.0, 1, 2, 1)
    assert cadence.interruptions(kills, now) == Interruptions(400.0, 4, 4, 4)
    assert interval(kills, now) < interval(one_kill, now) < interval(calm, now)
    # 4 interruptions in 400 s (killed attempts end at their step beat): 100 s between them.
    seen = cadence.interruptions(kills, now)
    between = cadence.time_between_interruptions(seen, cadence.prior())
    assert (between.source, between.seconds) == ("history", 100.0)
    assert between.detail == "the history: 4 interruption(s) in 6.7 min of this run (4 lost work)"
    # Daly: sqrt(2 x 2 x 100) x (1 + 0.1 / 3 + 2 / 1800) - 2 = 18.69 s, at 0.5 s a step.
    assert cadence.choose(Measurements(2.0, 2.0, 0.5), between).steps == 38


def test_a_preemption_that_lost_nothing_still_counts_as_an_interruption() -> None:
    """A save at the signal says nothing about the next preemption, which may come without grace."""
    graceful = run_of((Cause.PREEMPTED, 40, 40), (Cause.FINISHED, 80, 80))
    one_kill = run_of((Cause.KILLED, 40, 30), (Cause.FINISHED, 80, 80))
    now = 10_000.0
    assert [cadence.lost_work(a) for a in graceful.attempts] == [False, False]
    assert cadence.interruptions(graceful, now) == Interruptions(200.0, 1, 2, 0)
    calm = run_of((Cause.FINISHED, 80, 80))
    assert interval(graceful, now) == interval(one_kill, now) < interval(calm, now)
    between = cadence.time_between_interruptions(cadence.interruptions(graceful, now), cadence.prior())
    assert between.detail == "the history: 1 interruption(s) in 3.3 min of this run (0 lost work)"
    # Preempted before its first step (nothing to lose), hung and failed count too.
    early = run_of((Cause.PREEMPTED, 0, None), (Cause.HUNG, 5, 5), (Cause.FAILED, 9, 5))
    early = early.with_attempt(replace(early.attempts[0], last_step=None))
    assert cadence.interruptions(early, now) == Interruptions(300.0, 3, 3, 1)


def young(d: float, m: float) -> float:
    """Young's first-order optimum, ``sqrt(2dM)``: Daly's is shorter."""
    return math.sqrt(2 * d * m)


def test_daly_higher_order_optimum() -> None:
    # The formula, written out, for a save stall d below twice the time between interruptions M.
    for d, m in ((2.0, 3600.0), (0.2, 30.0), (100.0, 150.0), (1.0, 0.51)):
        written = math.sqrt(2 * d * m) * (1 + math.sqrt(d / (2 * m)) / 3 + d / (18 * m)) - d
        assert cadence.daly(d, m) == pytest.approx(written, rel=1e-12)
        x = math.sqrt(d / (2 * m))  # the same, factored: 2M x (1 - x/3)^2
        assert cadence.daly(d, m) == pytest.approx(2 * m * x * (1 - x / 3) ** 2, rel=1e-12)
        assert 0 < cadence.daly(d, m) < young(d, m)
    assert cadence.daly(2.0, 3600.0) == pytest.approx(118.6704, abs=1e-4)  # Young's: 120 s
    # A cheap save: two thirds of the stall shorter than Young's.
    assert cadence.daly(0.01, 3600.0) == pytest.approx(young(0.01, 3600.0) - 0.01 * 2 / 3, abs=1e-5)
    # A save as costly as twice M or more: once per interruption.
    assert cadence.daly(300.0, 150.0) == 150.0 and cadence.daly(301.0, 150.0) == 150.0
    assert cadence.daly(0.0, 100.0) == 0.0 and cadence.daly(1.0, 0.0) == 0.0


def test_the_cost_of_a_save_is_the_mean_after_the_first_long_ones_included() -> None:
    # Measured: 128 MB synchronous saves on a 2-core VM, every 20 steps: the first pays one-time
    # costs, a third of the others take twice as long as the rest (write-back throttling).
    first, later = 1.46, [0.21, 0.22, 0.50, 0.23, 0.22, 0.52, 0.24, 0.21]
    assert cadence.mean_stall(later) == pytest.approx(sum(later) / len(later))
    assert cadence.mean_stall(later) > 1.2 * sorted(later)[len(later) // 2]  # not the median
    assert cadence.mean_stall([]) is None
    none, recorded = Stalls(), Stalls(1.0, 2)
    mine = Stalls(sum(later), len(later))
    # This attempt's later saves pooled with the recorded ones; its own alone once it has enough.
    assert cadence.save_cost(mine, recorded) == pytest.approx((sum(later) + 1.0) / (len(later) + 2))
    assert cadence.save_cost(mine, recorded, enough=len(later)) == pytest.approx(mine.mean)
    assert cadence.save_cost(none, recorded) == 0.5  # before its second save: the recorded ones
    assert cadence.save_cost(none, none) is None  # only first saves: still measuring (never `first`)
    # What a restart starts from: the attempt's mean after its first save.
    saves = LastCkptSaves()
    for stall in [first, *later]:
        saves = saves.stalled(stall)
    assert saves.first_stall == first and saves.last_stall == later[-1]
    assert saves.later.count == len(later) and saves.later.mean == pytest.approx(cadence.mean_stall(later))
    assert LastCkptSaves().later == Stalls() == LastCkptSaves().stalled(0.7).later  # a first save only
    old = LastCkptSaves(count=2, stall_seconds=1.0)  # recorded before first_stall was kept
    assert old.later == Stalls(1.0, 2)


def test_a_restart_prices_a_save_from_the_later_saves_of_the_newest_attempts() -> None:
    """At a high interruption rate attempts make one or two saves: the newest attempt alone would
    often say only its first save's one-time costs (1.4 s for saves of 0.3 s)."""

    def attempt(number: int, *stalls: float) -> Attempt:
        saves = LastCkptSaves()
        for stall in stalls:
            saves = saves.stalled(stall)
        return replace(Attempt(number, "node", 1, None, started=0.0), last_ckpt_saves=saves)

    history = History(
        attempts=(
            attempt(1, 1.4, 0.9, 0.9, 0.9, 0.9),  # oldest: left out once the newer ones are enough
            attempt(2, 1.4, 0.2, 0.4),
            attempt(3, 1.5),  # one save: nothing but one-time costs
            attempt(4, 1.4, 0.3),
            attempt(5),  # killed before its first save
        )
    )
    assert cadence.last_measured(history).later.mean == pytest.approx(0.3)  # type: ignore[union-attr]
    pooled = cadence.recorded_stalls(history, enough=3)  # attempts 4 and 2
    assert pooled.count == 3 and pooled.seconds == pytest.approx(0.9)
    assert cadence.recorded_stalls(history, enough=100).count == 7  # the whole history
    assert cadence.recorded_stalls(History(attempts=(attempt(1, 1.5),)), enough=3) == Stalls()
    restart = cadence.save_cost(Stalls(), cadence.recorded_stalls(history, enough=3))
    assert restart == pytest.approx(0.3)


def test_the_running_attempt_counts_until_now_and_a_long_calm_outgrows_the_prior() -> None:
    running = History(attempts=(Attempt(1, "node", 1, None, started=0.0),))
    assert cadence.interruptions(running, now=500.0) == Interruptions(500.0, 0, 1, 0)
    short_prior = cadence.prior(user_seconds=100.0)
    between = cadence.time_between_interruptions(cadence.interruptions(running, 500.0), short_prior)
    assert (between.seconds, between.source) == (500.0, "history")
    early = cadence.time_between_interruptions(cadence.interruptions(running, 50.0), short_prior)
    assert (early.seconds, early.source) == (100.0, "user")


def test_the_users_expected_time_stays_in_the_estimate_as_one_more_interruption() -> None:
    """A user's value damps the first, noisy lifetimes; an assumed prior (a day) gives way at once."""
    one_kill = run_of((Cause.KILLED, 40, 30), (Cause.FINISHED, 80, 80))
    seen = cadence.interruptions(one_kill, now=10_000.0)  # 1 interruption in 200 s
    users = cadence.time_between_interruptions(seen, cadence.prior(user_seconds=1000.0))
    assert (users.source, users.seconds) == ("history", 600.0)  # (200 + 1000) / (1 + 1)
    assert users.detail == (
        "the history: 1 interruption(s) in 3.3 min of this run (1 lost work), "
        "and expected_interruption_every=16.7 min counted as one more"
    )
    assert cadence.time_between_interruptions(seen, cadence.prior()).seconds == 200.0
    assert cadence.time_between_interruptions(seen, cadence.prior(time_limit_seconds=900.0)).seconds == 200.0
    # A history that disagrees outweighs it as it grows: 20 interruptions 10 s apart, told 1000 s.
    kills = run_of(*((Cause.KILLED, 10, 5),) * 20, seconds=10.0)
    many = cadence.time_between_interruptions(
        cadence.interruptions(kills, 1e6), cadence.prior(user_seconds=1000.0)
    )
    assert many.seconds == pytest.approx((200 + 1000) / 21)


def test_young_daly_and_its_bounds() -> None:
    def choose(stall: float, durable: float, step: float, between: float) -> cadence.Choice:
        return cadence.choose(Measurements(stall, durable, step), cadence.Between(between, "user", "given"))

    plain = choose(stall=2.0, durable=2.0, step=0.5, between=3600.0)
    assert plain.young_daly == pytest.approx(cadence.daly(2.0, 3600.0)) and plain.bound is None
    assert plain.steps == 238 and plain.seconds == pytest.approx(119.0)  # Daly's 118.67 s, in steps
    # A background write that takes longer than the interval: never two saves in flight.
    slow_write = choose(stall=0.01, durable=30.0, step=0.5, between=3600.0)
    assert (slow_write.bound, slow_write.steps) == (Bound.TO_DURABLE, 60)
    # A costly save: Daly's higher-order terms shorten it (Young's would be 173 s, longer than M).
    costly = choose(stall=100.0, durable=100.0, step=1.0, between=150.0)
    assert (costly.bound, costly.steps) == (None, 113)
    # A save costlier than twice M: Daly says once per interruption, the time to durable says later.
    costlier = choose(stall=400.0, durable=400.0, step=1.0, between=150.0)
    assert (costlier.bound, costlier.steps, costlier.young_daly) == (Bound.TO_DURABLE, 400, 150.0)
    # Steps longer than the interval: every step.
    tiny = choose(stall=0.001, durable=0.001, step=10.0, between=60.0)
    assert (tiny.bound, tiny.steps) == (Bound.ONE_STEP, 1)
    assert "every 238 steps" in plain.describe() and "sqrt(2 x 2 s save stall x 60.0 min" in plain.describe()
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
    assert read.last_ckpt_saves == LastCkptSaves(2, 2.0, 1.5, 1.5, 2, 4.0, 3.0, first_stall=0.5)
    assert read.end is not None and (read.end.signal, read.end.notice) == ("SIGTERM", "file")
    chosen = cadence.choice_from_dict(cadence.last_cadence(back) or {})
    assert chosen is not None and chosen.describe() == choice.describe() and chosen.steps == choice.steps
    assert cadence.recorded_to_durable(tmp_path) == 4.0


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


def test_launches_killed_while_starting_count_from_the_gaps_in_the_restart_count() -> None:
    """A requeue killed during its imports never reaches RunDir: only the scheduler's count shows it."""
    between = attempts.unrecorded_between
    assert between("slurm-42-stepbatch-r0", "slurm-42-stepbatch-r1") == 0
    assert between("slurm-42-stepbatch-r1", "slurm-42-stepbatch-r4") == 2
    assert between("slurm-42_7-stepbatch-r2", "slurm-42_7-stepbatch-r5") == 2  # an array task
    assert between("elastic-abc-r0", "elastic-abc-r3") == 2
    assert between(None, "slurm-42-stepbatch-r2") == 2  # the first record: r0 and r1 died starting
    assert between(None, "slurm-42-stepbatch-r0") == 0
    assert between("slurm-41-stepbatch-r3", "slurm-42-stepbatch-r1") == 0  # another job
    assert between("slurm-42-step0-r1", "slurm-42-step3-r4") == 0  # another step
    assert between("local-127.0.0.1-29500-pg7", "local-127.0.0.1-29500-pg9") == 0  # no count
    assert between("slurm-42-stepbatch-r4", None) == 0

    history = History()
    for number, (launch, start) in enumerate(
        (("slurm-42-stepbatch-r0", 0.0), ("slurm-42-stepbatch-r3", 300.0))
    ):
        history = attempts.begin(history, Attempt(number + 1, "node", 1, launch, started=start), None)
        end = End(start + 100.0, Cause.KILLED, "killed") if number == 0 else None
        if end is not None:
            history = history.with_attempt(replace(history.attempts[-1], end=end))
    assert [a.unrecorded_launches for a in history.attempts] == [0, 2]
    seen = cadence.interruptions(history, now=400.0)
    assert seen == Interruptions(200.0, 3, 4, 1, unrecorded=2)
    with_gaps = cadence.time_between_interruptions(seen, cadence.prior())
    assert with_gaps.seconds == pytest.approx(200.0 / 3)
    assert with_gaps.detail.endswith("(1 lost work, 2 killed while starting)")
    blind = replace(history, attempts=tuple(replace(a, unrecorded_launches=0) for a in history.attempts))
    assert interval(history, 400.0) < interval(blind, 400.0)
    # Kept in attempts.json, written only when there were any.
    assert attempts.attempt_from_dict(attempts.attempt_to_dict(history.attempts[1])).unrecorded_launches == 2
    assert "unrecorded_launches" not in attempts.attempt_to_dict(history.attempts[0])
