"""The straggler rule over the ranks' window summaries, without a Trainer."""

from __future__ import annotations

import random
import statistics

import pytest

from lightning_resume.straggler.decision import (
    RankTimes,
    Rule,
    Straggler,
    advance,
    median_without,
    milliseconds,
    slow_ranks,
    waits,
)

RULE = Rule(threshold=0.2, floor=0.05, patience=2)
FAST = RankTimes(data=0.010, compute=0.100, collective=0.200, optimizer=0.005)


def window(**slow: RankTimes) -> list[RankTimes]:
    """Four ranks at FAST, with ``r<N>=...`` for the ones that differ."""
    return [slow.get(f"r{rank}", FAST) for rank in range(4)]


def test_a_rank_slower_in_one_part_is_slow_in_that_part_against_the_median_of_the_others() -> None:
    found = slow_ranks(window(r2=RankTimes(data=0.160, compute=0.1, collective=0.05, optimizer=0.005)), RULE)
    assert list(found) == [2]
    assert (found[2].part, found[2].seconds, found[2].median) == ("data", 0.160, 0.010)


def test_the_slow_part_is_the_one_with_the_largest_excess() -> None:
    both = RankTimes(data=0.080, compute=0.400, collective=0.0, optimizer=0.005)
    assert slow_ranks(window(r1=both), RULE)[1].part == "compute"


def test_two_ranks_slow_in_different_parts_are_both_found() -> None:
    found = slow_ranks(
        window(r1=RankTimes(0.01, 0.3, 0.0, 0.005), r2=RankTimes(0.16, 0.1, 0.05, 0.005)), RULE
    )
    assert {rank: slow.part for rank, slow in found.items()} == {1: "compute", 2: "data"}


@pytest.mark.parametrize(
    ("compute", "slow"),
    [
        (0.100 + 0.049, False),  # below the floor (50 ms), though 49% slower
        (0.100 + 0.051, True),
    ],
)
def test_the_floor_in_seconds_holds_back_small_excesses(compute: float, slow: bool) -> None:
    found = slow_ranks(window(r3=RankTimes(0.01, compute, 0.2, 0.005)), RULE)
    assert (3 in found) is slow


def test_the_threshold_is_relative_to_the_median_of_the_others() -> None:
    big = RankTimes(0.01, 1.000, 0.2, 0.005)
    others = [big, big, big]
    assert not slow_ranks([*others, RankTimes(0.01, 1.19, 0.2, 0.005)], RULE)  # 19% > floor, < 20%
    assert list(slow_ranks([*others, RankTimes(0.01, 1.21, 0.2, 0.005)], RULE)) == [3]


def test_two_ranks_compare_with_each_other_and_unmeasured_parts_are_left_out() -> None:
    assert list(slow_ranks([FAST, RankTimes(0.5, None, None, None)], RULE)) == [1]
    assert not slow_ranks([FAST], RULE)
    assert not slow_ranks([RankTimes(), RankTimes(data=5.0)], RULE)  # no other rank measured data


def test_a_rank_is_due_after_patience_windows_in_a_row_and_a_clean_window_resets_it() -> None:
    slow = window(r1=RankTimes(0.01, 0.4, 0.0, 0.005))
    streaks, due = advance({}, slow, RULE)
    assert streaks == {1: 1} and due == []
    streaks, due = advance(streaks, window(), RULE)
    assert streaks == {} and due == []
    streaks, _ = advance(streaks, slow, RULE)
    streaks, due = advance(streaks, slow, RULE)
    assert streaks == {1: 2} and [(found.rank, found.part, windows) for found, windows in due] == [
        (1, "compute", 2)
    ]
    _, due = advance(streaks, slow, RULE)
    assert [windows for _, windows in due] == [3]  # still due: the caller names each rank once


def test_median_without_one_element_matches_the_plain_median() -> None:
    rng = random.Random(3)
    for n in range(2, 9):
        values = sorted(rng.random() for _ in range(n))
        for i in range(n):
            assert median_without(values, i) == pytest.approx(statistics.median(values[:i] + values[i + 1 :]))


def test_waits_give_the_rank_s_and_the_median_of_the_others() -> None:
    times = window(r1=RankTimes(0.01, 0.3, 0.001, 0.005))
    assert waits(times, 1) == (0.001, 0.2)
    assert waits([RankTimes(), RankTimes(collective=0.1)], 1) == (0.1, None)


def test_a_straggler_describes_itself_in_one_line_and_round_trips_through_a_dict() -> None:
    straggler = Straggler(3, "gpu-017", "data", 0.150, 0.010, 3, 420, waited=0.002, others_waited=0.148)
    assert (
        straggler.describe() == "rank 3 on node gpu-017: data wait 150 ms per step vs median 10 ms, 3 windows"
    )
    assert Straggler.from_dict({**straggler.to_dict(), "added_later": 1}) == straggler
    assert [milliseconds(s) for s in (0.15, 0.0025, 0.00004, None)] == ["150 ms", "2.5 ms", "0.04 ms", "-"]
