"""A copy fetched at a restart is loaded without hashing it a second time (the fetch hashed it as it
arrived): its manifest and size are still checked, and a copy that no longer matches is not loaded."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_resume._storage.manifest import Entry, checksum_file, encode, manifest_path
from lightning_resume.io.memory.node_memory import _load_received


def committed(path: Path, step: int) -> Entry:
    torch.save({"global_step": step, "weights": torch.arange(1000)}, path)
    size, checksum = checksum_file(path)
    entry = Entry(size=size, checksum=checksum, global_step=step)
    manifest_path(path).write_text(encode([entry]))
    return entry


def test_a_received_copy_is_loaded_when_its_manifest_and_size_match(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    entry = committed(path, step=3)
    loaded = _load_received(path, "cpu", weights_only=True)
    assert loaded.checkpoint is not None and loaded.checkpoint["global_step"] == 3
    assert loaded.verdict.manifest == entry


def test_a_received_copy_that_no_longer_matches_its_manifest_is_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    committed(path, step=3)
    with open(path, "ab") as grown:  # changed after its commit: its size no longer matches
        grown.write(b"\0")
    loaded = _load_received(path, "cpu", weights_only=True)
    assert loaded.checkpoint is None and loaded.reason


def test_a_received_copy_damaged_in_place_is_refused_not_raised(tmp_path: Path) -> None:
    """Same size, other bytes: the load fails, and the full check (not an exception on this one rank,
    which would leave the others waiting) says the copy is damaged, so the next copy is tried."""
    path = tmp_path / "last.ckpt"
    committed(path, step=3)
    with open(path, "r+b") as damaged:
        damaged.write(b"\0" * 64)  # the zip's first local header
    loaded = _load_received(path, "cpu", weights_only=True)
    assert loaded.checkpoint is None and "checksum" in loaded.reason
