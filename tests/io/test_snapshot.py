"""Snapshots into shared memory, written by the torch-free archive writer, load with plain ``torch.load``.

These tests pin the one private torch API the package uses (``torch.serialization._save`` writing
records to any ``write_record`` sink): they fail loudly when an upgrade of torch changes it.
"""

from __future__ import annotations

import ctypes
import io
import logging
import pickle
import threading
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from lightning_resume._compat.torch import torch_records_supported
from lightning_resume._storage.archive import write_archive
from lightning_resume._storage.manifest import ChecksumWriter
from lightning_resume.io.routes import write_torch_archive
from lightning_resume.io.snapshot import ALONE_BELOW, PIECE, HostBuffer, Staged, copy_regions, snapshot


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
        write(snapshot(checkpoint, buffer), buffer, path)
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
    staged = snapshot(checkpoint, buffer)
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
    snapshot({"w": torch.zeros(1000)}, buffer)
    size, fd = buffer.size, buffer.fd
    snapshot({"w": torch.ones(1000)}, buffer)
    assert (buffer.size, buffer.fd) == (size, fd)
    staged = snapshot({"w": torch.ones(100_000)}, buffer)
    assert buffer.size >= 400_000 and buffer.fd == fd
    write(staged, buffer, tmp_path / "big.ckpt")
    assert torch.equal(torch.load(tmp_path / "big.ckpt")["w"], torch.ones(100_000))
    buffer.close()


def test_records_are_picklable_for_the_pipe() -> None:
    buffer = HostBuffer()
    staged = snapshot({"w": torch.zeros(10), "boxed": Box(torch.ones(2))}, buffer)
    assert pickle.loads(pickle.dumps(staged.records)) == staged.records
    assert {kind for _, (kind, *_) in staged.records} == {"shm", "bytes"}
    buffer.close()


class Spy:
    """Wraps ``ctypes.memmove``, recording which thread copied each piece.

    ``together``: the first piece waits (up to 10 s) until another thread copies one too, so that a copy
    spread over threads shows as such however loaded the machine is. ``fail_in_caller``: the calling
    thread raises at its first piece (as an exception from a signal handler would there), and the
    helper threads wait until it has.
    """

    def __init__(self, together: bool = False, fail_in_caller: bool = False) -> None:
        self.real = ctypes.memmove
        self.threads: list[int] = []
        self.together, self.fail_in_caller = together, fail_in_caller
        self.second, self.caller_failed = threading.Event(), threading.Event()

    def __call__(self, dst: int, src: int, nbytes: int) -> None:
        caller = threading.current_thread() is threading.main_thread()
        if self.fail_in_caller:
            if caller:
                self.caller_failed.set()
                raise KeyboardInterrupt
            self.caller_failed.wait(10)
        self.threads.append(threading.get_ident())
        if self.together and len(set(self.threads)) > 1:
            self.second.set()
        if self.together and len(self.threads) == 1:
            self.second.wait(10)
        self.real(dst, src, nbytes)


def random_bytes(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_regions_are_copied_exactly_by_several_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    sources = [random_bytes(n, i) for i, n in enumerate([0, 1, 4095, PIECE + 3, 2 * PIECE])]
    targets = [torch.zeros_like(s) for s in sources]
    spy = Spy(together=True)  # on a loaded machine one thread could otherwise take every piece
    monkeypatch.setattr(ctypes, "memmove", spy)
    copy_regions(
        [(d.data_ptr(), s.data_ptr(), s.numel()) for d, s in zip(targets, sources, strict=True)], threads=3
    )
    assert all(torch.equal(d, s) for d, s in zip(targets, sources, strict=True))
    assert len(spy.threads) == 0 + 1 + 1 + 2 + 2  # pieces of at most PIECE bytes
    assert 1 < len(set(spy.threads)) <= 3
    assert not [t for t in threading.enumerate() if t.name == "lightning-resume-copy"]


def test_small_copies_stay_in_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    source = random_bytes(1 << 20, 0)
    target = torch.zeros_like(source)
    spy = Spy()
    monkeypatch.setattr(ctypes, "memmove", spy)
    copy_regions([(target.data_ptr(), source.data_ptr(), source.numel())], threads=4, piece=4096)
    assert torch.equal(target, source) and set(spy.threads) == {threading.get_ident()}


def test_an_interrupted_copy_stops_its_helpers_before_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    source = random_bytes(ALONE_BELOW, 0)
    target = torch.zeros_like(source)
    monkeypatch.setattr(ctypes, "memmove", Spy(fail_in_caller=True))
    with pytest.raises(KeyboardInterrupt):
        copy_regions([(target.data_ptr(), source.data_ptr(), source.numel())], threads=2, piece=1 << 20)
    # The memory may be freed as the exception unwinds: no helper may still be copying.
    assert not [t for t in threading.enumerate() if t.name == "lightning-resume-copy"]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_large_checkpoint_is_staged_exactly_with_torchs_thread_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    weights = torch.randn(ALONE_BELOW // 4 + 5, generator=torch.Generator().manual_seed(1))
    expected = weights.clone()
    checkpoint = {"w": weights, "w2": weights[10:20], "b": torch.ones(3)}
    spy = Spy(together=threads > 1)
    monkeypatch.setattr(ctypes, "memmove", spy)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    buffer = HostBuffer()
    staged = snapshot(checkpoint, buffer)
    weights.zero_()
    write(staged, buffer, tmp_path / "big.ckpt")
    loaded = torch.load(tmp_path / "big.ckpt")
    assert torch.equal(loaded["w"], expected) and torch.equal(loaded["w2"], expected[10:20])
    assert loaded["w2"].untyped_storage().data_ptr() == loaded["w"].untyped_storage().data_ptr()
    assert len(set(spy.threads)) == threads
    buffer.close()


def test_staging_phases_are_measured_only_when_debug_logging_is_on(caplog: pytest.LogCaptureFixture) -> None:
    buffer = HostBuffer()
    with caplog.at_level(logging.INFO, logger="lightning_resume.io.snapshot"):
        snapshot({"w": torch.zeros(10)}, buffer)
    assert not caplog.records
    with caplog.at_level(logging.DEBUG, logger="lightning_resume.io.snapshot"):
        snapshot({"w": torch.zeros(10)}, buffer)
    (record,) = caplog.records
    assert list(record.phases) == ["plan", "copy", "views", "pickle"]  # type: ignore[attr-defined]
    assert "copy" in record.getMessage() and "faults" in record.getMessage()
    buffer.close()
