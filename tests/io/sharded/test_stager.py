"""``ReusedBufferStager``: the staged copy is a snapshot, through buffers allocated once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from lightning_resume.io.sharded.stager import ReusedBufferStager
from lightning_resume.io.snapshot import ALONE_BELOW


def state() -> dict[str, object]:
    big = torch.arange(ALONE_BELOW // 4 + 12345, dtype=torch.float32)  # above the threaded-copy size
    return {
        "model": {"big": big, "odd": torch.arange(7, dtype=torch.int16), "empty": torch.empty(0)},
        "transposed": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous: copied by copy_
        "optimizer": [{"step": torch.tensor(3.0), "lr": 0.1}, ("name", torch.ones(5, dtype=torch.bool))],
    }


def flat(value: object) -> list[object]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in flat(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in flat(v)]
    return [value]


@pytest.fixture(params=[1, 2], ids=["copy_", "threaded pieces"])
def torch_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("torch_threads")
def test_a_staged_state_keeps_its_values_while_the_source_changes_and_reuses_its_buffers() -> None:
    source = state()
    stager = ReusedBufferStager()
    assert ReusedBufferStager.supports(source)
    staged = stager.stage(source)
    expected = [x.clone() if isinstance(x, torch.Tensor) else x for x in flat(source)]
    for x in flat(source):
        if isinstance(x, torch.Tensor):
            x.copy_(torch.zeros_like(x) if x.dtype == torch.bool else x + 1)
    first = flat(staged)
    for got, want in zip(first, expected, strict=True):
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
        else:
            assert got == want
    assert isinstance(staged["optimizer"][1], tuple)

    again = flat(stager.stage(source))  # the changed values, in the same buffers
    for got, before, now in zip(again, first, flat(source), strict=True):
        if isinstance(now, torch.Tensor):
            assert got.data_ptr() == before.data_ptr() and torch.equal(got, now)
    stager.close()
