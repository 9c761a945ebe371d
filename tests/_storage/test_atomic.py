from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lightning_resume._storage.atomic import (
    TEMP_PREFIX,
    atomic_open,
    create_text_exclusive,
    write_text_atomic,
)


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    write_text_atomic(target, "old")
    with pytest.raises(RuntimeError), atomic_open(target, "w") as handle:
        handle.write("half")
        raise RuntimeError("disk went away")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_kill_during_write_never_tears_the_file(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    write_text_atomic(target, "old")
    code = (
        "import os, signal, sys\n"
        "from lightning_resume._storage.atomic import atomic_open\n"
        "with atomic_open(sys.argv[1]) as f:\n"
        "    f.write(b'x' * 1000)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(target)])
    assert proc.returncode == -9
    assert target.read_text() == "old"
    assert all(p.name == "f.bin" or p.name.startswith(TEMP_PREFIX) for p in tmp_path.iterdir())


def test_exclusive_create_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    assert create_text_exclusive(target, "first")
    assert not create_text_exclusive(target, "second")
    assert target.read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]
