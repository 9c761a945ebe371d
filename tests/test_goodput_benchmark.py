"""``benchmarks/goodput.py``'s preemption process: every row of a rate meets the same one (the same
arrivals, the same kind for its n-th preemption), and the kinds keep the mix's shares from the start."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "goodput.py"
MIX = {"sigterm": 0.4, "notice": 0.3, "sigkill": 0.3}


@pytest.fixture(scope="module")
def goodput() -> ModuleType:
    spec = importlib.util.spec_from_file_location("goodput_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_kinds_are_seeded_and_every_block_of_ten_holds_the_mix(goodput: ModuleType) -> None:
    kinds = goodput.kind_sequence(3, MIX, 35)
    assert kinds == goodput.kind_sequence(3, MIX, 35)  # every row of a rate: the same n-th kind
    assert kinds != goodput.kind_sequence(4, MIX, 35)  # another rate: another sequence
    for start in range(0, 30, goodput.KIND_BLOCK):
        block = kinds[start : start + goodput.KIND_BLOCK]
        assert Counter(block) == {"sigterm": 4, "notice": 3, "sigkill": 3}
    # Shares that do not fill a block: the largest remainders take the rest.
    assert (
        Counter(goodput.kind_sequence(0, {"sigterm": 1, "notice": 1, "sigkill": 1}, 10)).most_common(1)[0][1]
        == 4
    )
    assert goodput.kind_sequence(0, {"notice": 1.0}, 3) == ["notice"] * 3


def test_the_arrivals_are_seeded_poisson_and_reach_the_horizon(goodput: ModuleType) -> None:
    times = goodput.arrivals(0, 10.0, 20_000.0)
    assert times == goodput.arrivals(0, 10.0, 20_000.0) and times == sorted(times)
    assert times[0] > 0 and times[-1] <= 20_000.0
    assert len(times) == pytest.approx(2000, rel=0.1)  # mean 10 s apart


def test_the_kept_steps_are_the_copies_the_final_weights_descend_from(goodput: ModuleType) -> None:
    outcome = goodput.Outcome(
        goodput.Row("ours", 20), wall=30.0, launches=[goodput.Launch(100.0), goodput.Launch(110.0)]
    )
    # Attempt 1 trains steps 1-5 and is killed after its save at step 3; attempt 2 resumes there.
    outcome.progress = {
        1: [(step, 100.0 + step) for step in range(1, 6)],
        2: [(step, 110.0 + step) for step in range(4, 8)],
    }
    assert outcome.kept_times() == [1.0, 2.0, 3.0, 14.0, 15.0, 16.0, 17.0]
    assert [lost for _, lost in outcome.losses()] == [2, 0]
    # Goodput over the first 15 s: 5 of the final steps trained by then, at 1.5 s a step.
    assert goodput.at_horizon(outcome.kept_times(), 15.0, 1.5) == 0.5


def test_the_targets_are_judged_on_differences_seed_by_seed(goodput: ModuleType) -> None:
    def rows(plain: float, every20: float, every60: float, auto: float) -> list[dict[str, object]]:
        values = {"plain Lightning every 60": plain, "ours every 20": every20, "ours every 60": every60}
        values["ours auto"] = auto
        return [{"row": name, "at_horizon": value, "notice_losses": []} for name, value in values.items()]

    found = goodput.compare([rows(0.40, 0.50, 0.52, 0.51), rows(0.44, 0.49, 0.48, 0.50)])
    assert found["best"] == "ours every 60"  # the higher mean over the seeds: 50% against 49.5%
    assert found["auto_minus_best"].values == pytest.approx((-0.01, 0.02))
    assert found["auto_minus_own_best"].values == pytest.approx((-0.01, 0.01))  # each seed's best
    assert found["auto_minus_plain"].mean == pytest.approx(0.085)
    assert found["auto_minus_plain"].error == pytest.approx(0.025)
    assert found["auto_minus_best"].points() == "+0.5 ± 1.5 (-1.0..+2.0)"
    assert goodput.Spread((0.5,)).share() == "50.0%"
