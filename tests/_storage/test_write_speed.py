"""``measure_write_speed``: a timed durable write into a directory that leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightning_resume._storage.writer import measure_write_speed


def test_measures_bytes_per_second_and_leaves_the_directory_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    assert measure_write_speed(tmp_path, 3 << 20) > 0
    assert measure_write_speed(tmp_path, 1000, direct=False) > 0  # shorter than one aligned block
    assert os.listdir(tmp_path) == ["keep.txt"]


def test_a_failed_write_is_raised_and_cleaned_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        measure_write_speed(tmp_path, 1 << 20)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        measure_write_speed(tmp_path / "missing", 1 << 20)
    with pytest.raises(ValueError, match="nbytes"):
        measure_write_speed(tmp_path, 0)
