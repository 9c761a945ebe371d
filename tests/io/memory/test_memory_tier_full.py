"""A memory tier that fills up mid-run: the save that does not fit goes to the durable tier, and no
older memory copy is written over it afterwards (at the end of training, or by a queued copy)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _system import mounted_tmpfs
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_resume import DurableCheckpointIO, LightningResumeWarning, MemoryTier
from lightning_resume._storage.catalog import check_file
from lightning_resume.io.durable_checkpoint_io import memory_tier_of


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs of its own (root only: ``mount``)."""
    with mounted_tmpfs(tmp_path / "shm", "2m") as folder:
        yield folder


def state(step: int) -> dict[str, object]:
    return {"global_step": step, "epoch": 0, "weights": torch.full((100_000,), float(step))}  # 400 kB


def test_a_save_that_no_longer_fits_goes_durable_and_stays_the_newest(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    durable_dir = tmp_path / "ckpt"
    io = DurableCheckpointIO(asynchronous=False, memory=MemoryTier(small_tmpfs, durable_every=1000))
    tier = memory_tier_of(io)
    assert tier is not None
    tier.attach(SingleDeviceStrategy(torch.device("cpu")), durable_dir)
    last = durable_dir / "last.ckpt"
    io.save_checkpoint(state(1), last)  # memory, and durable (the first save)
    io.save_checkpoint(state(2), last)  # memory only
    tier.memory.settle()  # the copies run in the background
    assert check_file(last).manifest.global_step == 1  # type: ignore[union-attr]
    free = shutil.disk_usage(small_tmpfs).free
    (small_tmpfs / "filler").write_bytes(b"\0" * (free - 100_000))  # someone else fills the tmpfs
    with pytest.warns(LightningResumeWarning, match="is full"):
        io.save_checkpoint(state(3), last)  # does not fit: durable
    assert check_file(last).manifest.global_step == 3  # type: ignore[union-attr]
    io.teardown()  # the end of training: the older step 2 in memory must not replace step 3
    assert check_file(last).manifest.global_step == 3  # type: ignore[union-attr]
    tier.close()
    loaded = DurableCheckpointIO(memory=MemoryTier(small_tmpfs, durable_every=1000))
    again = memory_tier_of(loaded)
    assert again is not None
    again.attach(SingleDeviceStrategy(torch.device("cpu")), durable_dir)
    assert loaded.load_checkpoint(last)["global_step"] == 3  # the durable one: newer than memory's step 2
    assert loaded.last_restore is not None and loaded.last_restore.tier == "durable"
    again.close()
