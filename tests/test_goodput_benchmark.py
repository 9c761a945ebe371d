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
