"""Local commits: what is on disk at every step, and cleaning up after dead writers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_resume._storage.atomic import temp_sibling
from lightning_resume._storage.catalog import Status, check_file, scan
from lightning_resume._storage.commit import clean_stale, commit_file, held, remove
from lightning_resume._storage.kinds import FILE
from lightning_resume._storage.manifest import Entry, manifest_path, read_entries
from lightning_resume._storage.store import LocalStore
from lightning_resume._storage.writer import Aside


def write_file(path: Path, data: bytes, known: Entry | None = None, fail: OSError | None = None) -> Entry:
    """The writer and commit steps of a save of ``data`` (``fail``: raised after the data is written)."""
    aside = Aside(path)
    with aside as out:
        out.write(data)
        if fail is not None:
            raise fail
    return commit_file(aside, {"saved_at": float(len(data))}, known)[0]


def verifies(path: Path) -> bool:
    return check_file(path).status is Status.VERIFIED


def test_commit_writes_data_and_manifest(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    first = write_file(path, b"one")
    assert path.read_bytes() == b"one" and verifies(path)
    second = write_file(path, b"second", known=first)
    assert path.read_bytes() == b"second"
    assert read_entries(path) == [second, first]
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "last.ckpt.manifest.json"]


def test_a_failed_write_leaves_the_previous_checkpoint_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    write_file(path, b"good")

    with pytest.raises(OSError, match="No space"):
        write_file(path, b"partial", fail=OSError(28, "No space left on device"))
    assert path.read_bytes() == b"good" and verifies(path)
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "last.ckpt.manifest.json"]


def test_old_data_with_the_new_manifest_still_verifies(tmp_path: Path) -> None:
    """The window between the manifest rename and the data rename."""
    path = tmp_path / "last.ckpt"
    write_file(path, b"old")
    old_manifest = manifest_path(path).read_bytes()
    write_file(path, b"new!")
    new_manifest = manifest_path(path).read_bytes()
    path.write_bytes(b"old")  # the data rename had not happened yet
    assert verifies(path)
    manifest_path(path).write_bytes(old_manifest)
    path.write_bytes(b"new!")  # impossible order (data before manifest): must not verify
    assert not verifies(path)
    manifest_path(path).write_bytes(new_manifest)
    assert verifies(path)


def test_without_a_known_entry_the_current_file_is_found_by_size(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    first = write_file(path, b"aaa")
    assert held(path) == [first] == FILE.held(LocalStore(tmp_path), path.name)
    assert held(tmp_path / "missing.ckpt") == [] == FILE.held(LocalStore(tmp_path), "missing.ckpt")


def test_clean_stale_removes_dead_writers_temps_and_orphan_manifests(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)
    (tmp_path / f".lr-tmp-{dead_pid}-abc-last.ckpt").write_bytes(b"x")
    fd, mine = temp_sibling(tmp_path / "last.ckpt")
    os.close(fd)
    write_file(tmp_path / "gone.ckpt", b"x")
    (tmp_path / "gone.ckpt").unlink()
    (tmp_path / "user.txt").write_text("keep me")
    removed = clean_stale(tmp_path)
    assert removed == [f".lr-tmp-{dead_pid}-abc-last.ckpt"]  # a live temp (ours) blocks manifest cleanup
    mine.unlink()
    assert clean_stale(tmp_path) == ["gone.ckpt.manifest.json"]
    assert sorted(os.listdir(tmp_path)) == ["user.txt"]


def test_scan_lists_checkpoints_passing_the_size_check(tmp_path: Path) -> None:
    write_file(tmp_path / "a.ckpt", b"aaaa")
    write_file(tmp_path / "b.ckpt", b"bbbb")
    (tmp_path / "b.ckpt").write_bytes(b"bb")  # torn
    (tmp_path / "plain.ckpt").write_bytes(b"no manifest")
    assert list(scan(tmp_path)) == ["a.ckpt"]
    remove(LocalStore(tmp_path), FILE, "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists() and not manifest_path(tmp_path / "a.ckpt").exists()
