"""Two speeds: background writes are paced by ``background_share``; anything waiting lifts the pacing.

The writer reports how each write went (``DurableCheckpointIO.last_write``): the share it started
with and how many bytes it had written gently when a wait switched it to full speed. With a share of
0.001 a gentle write rests ~50 s after each ~50 ms of work, so a wait that did not switch it would
show as ``hurried_after is None`` (and a long wait). No test asserts a duration.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import DurableCheckpointIO, Preempted, PreemptionHandler, RequeueCheckpoint, RunDir
from lightning_resume._storage.catalog import Status, check_file

GENTLE = 0.001
BIG = 128 << 20  # 16 buffers of 8 MB: far more than one ~50 ms work period writes


def _tuned(**tuning: Any) -> DurableCheckpointIO:
    io = DurableCheckpointIO()
    io._tune(**tuning)
    return io


def big_state(seed: int = 0) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(BIG // 4, generator=generator), "global_step": seed}


def verifies(path: Path) -> bool:
    return check_file(path).status is Status.VERIFIED


def idle(io: DurableCheckpointIO) -> None:
    """Wait for the write in flight without waiting *on* it (which would switch it to full speed)."""
    while io.busy:
        time.sleep(0.01)


def mid_write(folder: Path) -> None:
    """Return once the writer has put some bytes of a temporary file on disk."""
    while True:
        for path in folder.iterdir():
            try:
                if path.name.startswith(".lr-tmp-") and path.stat().st_size > 0:
                    return
            except FileNotFoundError:
                pass
        time.sleep(0.002)


def started(tmp_path: Path, share: float = GENTLE) -> DurableCheckpointIO:
    """A plugin whose writer process is running and idle, with no wait on record."""
    io = _tuned(background_share=share)
    io.save_checkpoint({"w": torch.zeros(1)}, tmp_path / "warm.ckpt")
    idle(io)
    return io


def test_wait_until_durable_switches_a_background_write_to_full_speed(tmp_path: Path) -> None:
    io = started(tmp_path)
    path = tmp_path / "big.ckpt"
    io.save_checkpoint(big_state(), path)
    mid_write(tmp_path)
    io.wait_until_durable()
    stats = io.last_write
    assert stats is not None and stats.share == GENTLE
    assert stats.hurried_after is not None and 0 < stats.hurried_after < stats.nbytes
    assert stats.nbytes == path.stat().st_size and verifies(path)
    io.teardown()


def test_the_save_after_a_wait_runs_at_full_speed_and_the_one_after_it_gently(tmp_path: Path) -> None:
    io = started(tmp_path)
    io.save_checkpoint(big_state(1), tmp_path / "a.ckpt")
    mid_write(tmp_path)
    io.wait_until_durable()
    io.save_checkpoint({"w": torch.ones(10)}, tmp_path / "next.ckpt")  # e.g. the preemption's own save
    idle(io)
    assert io.last_write is not None and io.last_write.share == 1.0
    io.save_checkpoint({"w": torch.ones(10)}, tmp_path / "later.ckpt")
    idle(io)
    assert io.last_write is not None and io.last_write.share == GENTLE
    io.teardown()


def test_a_save_waiting_for_the_previous_one_switches_both_to_full_speed(tmp_path: Path) -> None:
    io = started(tmp_path)
    io.save_checkpoint(big_state(2), tmp_path / "a.ckpt")
    mid_write(tmp_path)
    io.save_checkpoint({"w": torch.ones(10)}, tmp_path / "b.ckpt")  # waits for a.ckpt first
    idle(io)
    assert io.last_write is not None and io.last_write.share == 1.0
    assert verifies(tmp_path / "a.ckpt") and verifies(tmp_path / "b.ckpt")
    io.teardown()


def test_teardown_finishes_a_background_write_at_full_speed(tmp_path: Path) -> None:
    io = started(tmp_path)
    io.save_checkpoint(big_state(3), tmp_path / "a.ckpt")
    mid_write(tmp_path)
    io.teardown()
    assert io.last_write is not None and io.last_write.hurried_after is not None
    assert verifies(tmp_path / "a.ckpt")


def test_hurry_finishes_the_write_in_flight_fast_and_writes_the_next_save_at_once(tmp_path: Path) -> None:
    io = started(tmp_path)
    io.save_checkpoint(big_state(5), tmp_path / "a.ckpt")
    mid_write(tmp_path)
    io._hurry()  # what PreemptionHandler does before its last save
    idle(io)
    assert io.last_write is not None and io.last_write.hurried_after is not None  # a.ckpt, switched
    last = tmp_path / "last.ckpt"
    io.save_checkpoint(big_state(6), last)
    assert not io.busy and verifies(last)  # durable when save_checkpoint returned
    assert io.last_write.share == 1.0 and io.last_write.nbytes == last.stat().st_size
    io.save_checkpoint(big_state(7), tmp_path / "b.ckpt")
    assert io.busy  # the save after it is a background save again
    io.teardown()
    assert verifies(tmp_path / "b.ckpt")


def test_full_share_writes_at_full_speed_from_the_start(tmp_path: Path) -> None:
    io = started(tmp_path, share=1.0)
    io.save_checkpoint(big_state(4), tmp_path / "a.ckpt")
    idle(io)
    stats = io.last_write
    assert stats is not None and (stats.share, stats.hurried_after, stats.rested_seconds) == (1.0, None, 0.0)
    io.teardown()


def test_a_synchronous_save_reports_its_write(tmp_path: Path) -> None:
    io = DurableCheckpointIO(asynchronous=False)
    assert io.last_write is None
    path = tmp_path / "s.ckpt"
    io.save_checkpoint({"w": torch.randn(1000), "global_step": 1}, path)
    stats = io.last_write
    assert stats is not None and stats.nbytes == path.stat().st_size and stats.share == 1.0
    assert stats.bytes_per_second > 0 and stats.seconds >= stats.fsync_seconds >= 0


@pytest.mark.parametrize("share", [0, 0.0, -0.5, 1.01, 2, float("nan")])
def test_background_share_must_be_a_fraction(share: Any) -> None:
    with pytest.raises(ValueError, match=r"background_share must be a fraction within \(0, 1\]"):
        _tuned(background_share=share)


@pytest.mark.parametrize("share", [True, "0.5"])
def test_background_share_must_be_a_number(share: Any) -> None:
    with pytest.raises(TypeError, match=r"background_share must be a fraction within \(0, 1\]"):
        _tuned(background_share=share)


@pytest.mark.parametrize("share", [1, 1.0, 0.25, 1e-3])
def test_background_share_accepts_fractions(share: float) -> None:
    assert _tuned(background_share=share).settings.background_share == float(share)


def test_the_preemption_save_is_hurried_and_its_write_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Signal(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 2:
                os.kill(os.getpid(), 15)

    class WriterProbe(pl.Callback):
        """Notes the writer process as fit stops (before the plugin's teardown stops it)."""

        writer_pid: int | None = -1

        def on_exception(self, trainer: pl.Trainer, *args: Any) -> None:
            self.writer_pid = io._writer_pid

    io = _tuned(background_share=GENTLE)
    handler, probe = PreemptionHandler(requeue=False), WriterProbe()
    callbacks = [RunDir(root=tmp_path / "runs"), RequeueCheckpoint(), handler, Signal(), probe]
    with caplog.at_level("WARNING", logger="lightning_resume"), pytest.raises(Preempted):
        tiny_trainer(*callbacks, tmp_path=tmp_path, plugins=[io]).fit(BoringModel())
    # The preemption's save is the run's first: hurried, it was written in the trainer at once, so no
    # writer process was ever started (a background save would have started one).
    assert probe.writer_pid is None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Preempted by SIGTERM")]
    assert len(lines) == 1 and " s after the signal (written in " in lines[0] and " MB/s)" in lines[0]
    report = handler.stop_report
    assert report is not None and report.write is not None
    assert report.write.nbytes == next((tmp_path / "runs").rglob("last.ckpt")).stat().st_size
