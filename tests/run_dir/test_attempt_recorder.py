"""``AttemptRecorder``'s record of a restore: the checkpoint IO's own when it has one, else the file's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_resume import DurableCheckpointIO
from lightning_resume.run_dir.attempt_recorder import restore_record


def test_a_restore_is_the_checkpoint_ios_own_record_when_it_has_one_of_this_process(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    io = DurableCheckpointIO(asynchronous=False)
    io.save_checkpoint({"global_step": 3, "state_dict": {"w": torch.zeros(1000)}}, path)
    io.wait_until_durable()
    before = time.time()
    io.load_checkpoint(path)

    record, ended = restore_record(io, str(path), loaded_at=None, since=before)
    assert record["tier"] == "durable" and record["step"] == 3 and record["bytes"] == path.stat().st_size
    assert ended is not None and ended == pytest.approx(record["started"] + record["seconds"], abs=1e-3)
    assert ended >= before

    # A load before this process's first code ran is another fit's: what the file says, with no tier.
    plain = {"tier": None, "path": str(path), "bytes": path.stat().st_size, "seconds": None}
    assert restore_record(io, str(path), loaded_at=7.0, since=time.time() + 60) == (plain, 7.0)
    assert restore_record(TorchCheckpointIO(), str(path), loaded_at=7.0, since=before) == (plain, 7.0)
    remote = {"tier": None, "path": "s3://bucket/last.ckpt", "bytes": None, "seconds": None}
    assert restore_record(TorchCheckpointIO(), "s3://bucket/last.ckpt", None, before) == (remote, None)
