"""Snapshots into shared memory, written by the torch-free archive writer, load with plain ``torch.load``.

These tests pin the one private torch API the package uses (``torch.serialization._save`` writing
records to any ``write_record`` sink): they fail loudly when an upgrade of torch changes it.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from lightning_resume._storage.manifest import ChecksumWriter
from lightning_resume._writer.zip_records import write_archive
from lightning_resume.io._snapshot import (
    HostBuffer,
    Staged,
    stage,
    torch_records_supported,
    write_torch_archive,
)


class Box:
    """A tensor outside plain containers (e.g. inside a callback's state object)."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


def write(staged: Staged, buffer: HostBuffer, path: Path) -> None:
    view = memoryview(buffer._map)  # type: ignore[arg-type]
    records = [(n, view[s[1] : s[1] + s[2]] if s[0] == "shm" else s[1]) for n, s in staged.records]
    with open(path, "wb") as raw:
        write_archive(ChecksumWriter(raw), records, staged.alignment)
    view.release()


def test_installed_torch_has_the_serialiser_entry_point() -> None:
    assert torch_records_supported()


@pytest.mark.parametrize("how", ["staged", "streamed"])
def test_archive_loads_with_torch_load_and_matches_torch_save(tmp_path: Path, how: str) -> None:
    """Staged: the asynchronous path (shared memory, then the writer). Streamed: the synchronous one."""
    base = torch.arange(12.0).view(3, 4)
    state = OrderedDict(w=base, row=base[1], half=torch.ones(3, dtype=torch.float16))
    state._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    checkpoint = {
        "state_dict": state,
        "optimizer_states": [{"state": {0: {"exp_avg": torch.zeros(3), "step": torch.tensor(4.0)}}}],
        "epoch": 2,
        "names": ("a", "b"),
        "param": torch.nn.Parameter(torch.ones(2)),
        "empty": torch.empty(0),
    }
    buffer = HostBuffer()
    path = tmp_path / "ours.ckpt"
    if how == "staged":
        write(stage(checkpoint, buffer), buffer, path)
    else:
        with open(path, "wb") as raw:
            write_torch_archive(checkpoint, ChecksumWriter(raw))

    loaded = torch.load(path, weights_only=False)
    assert (
        loaded["state_dict"]["row"].untyped_storage().data_ptr()
        == loaded["state_dict"]["w"].untyped_storage().data_ptr()
    )
    assert torch.equal(loaded["state_dict"]["row"], base[1])
    assert loaded["state_dict"]._metadata == {"": {"version": 1}}
    assert isinstance(loaded["param"], torch.nn.Parameter)
    assert loaded["names"] == ("a", "b") and loaded["epoch"] == 2
    assert torch.equal(loaded["optimizer_states"][0]["state"][0]["step"], torch.tensor(4.0))
    assert torch.load(path, weights_only=True, mmap=True)["state_dict"]["half"].dtype == torch.float16

    reference = io.BytesIO()
    torch.save(checkpoint, reference)
    names = [n for n in zipfile.ZipFile(reference).namelist() if "serialization_id" not in n]
    ours = [n for n in zipfile.ZipFile(path).namelist() if "serialization_id" not in n]
    assert ours == names
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        for info in archive.infolist():
            data_start = info.header_offset + 30 + len(info.filename) + len(_local_extra(path, info))
            assert data_start % 64 == 0, info.filename
    buffer.close()


def _local_extra(path: Path, info: zipfile.ZipInfo) -> bytes:
    with open(path, "rb") as f:
        f.seek(info.header_offset + 28)
        extra_len = int.from_bytes(f.read(2), "little")
        f.seek(info.header_offset + 30 + len(info.filename))
        return f.read(extra_len)


def test_snapshot_is_taken_when_stage_returns(tmp_path: Path) -> None:
    weights = torch.zeros(1000)
    meta = {"lr": [0.1]}
    checkpoint = {"w": weights, "meta": meta, "boxed": Box(torch.zeros(3))}
    buffer = HostBuffer()
    staged = stage(checkpoint, buffer)
    weights.add_(1)
    meta["lr"].append(0.2)
    checkpoint["boxed"].value.add_(5)
    path = tmp_path / "snap.ckpt"
    write(staged, buffer, path)
    loaded = torch.load(path, weights_only=False)
    assert torch.equal(loaded["w"], torch.zeros(1000))
    assert loaded["meta"] == {"lr": [0.1]}
    assert torch.equal(loaded["boxed"].value, torch.zeros(3))
    buffer.close()


def test_buffer_is_reused_and_grows(tmp_path: Path) -> None:
    buffer = HostBuffer()
    stage({"w": torch.zeros(1000)}, buffer)
    size, fd = buffer.size, buffer.fd
    stage({"w": torch.ones(1000)}, buffer)
    assert (buffer.size, buffer.fd) == (size, fd)
    staged = stage({"w": torch.ones(100_000)}, buffer)
    assert buffer.size >= 400_000 and buffer.fd == fd
    write(staged, buffer, tmp_path / "big.ckpt")
    assert torch.equal(torch.load(tmp_path / "big.ckpt")["w"], torch.ones(100_000))
    buffer.close()


def test_records_are_picklable_for_the_pipe() -> None:
    buffer = HostBuffer()
    staged = stage({"w": torch.zeros(10), "boxed": Box(torch.ones(2))}, buffer)
    assert pickle.loads(pickle.dumps(staged.records)) == staged.records
    assert {kind for _, (kind, *_) in staged.records} == {"shm", "bytes"}
    buffer.close()
