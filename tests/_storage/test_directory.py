"""Checkpoint directories: the commit, what a kill at each of its steps leaves, verification, cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import lightning_resume
from lightning_resume._storage.catalog import Status, candidates, verify
from lightning_resume._storage.commit import COMMIT_STEPS, committed
from lightning_resume._storage.kinds import DIRECTORY, MANIFEST_NAME, new_save_dir, resolve_pointer
from lightning_resume._storage.manifest import DirectoryManifest
from lightning_resume._storage.store import LocalStore
from lightning_resume.io.sharded import parts
from lightning_resume.io.sharded.parts import (
    DCP_REQUIRED,
    build_manifest,
    clean_up,
    commit_directory,
    read_manifest,
    write_part,
)

PACKAGE = Path(lightning_resume.__file__).parent
SHARDS = {"__0_0.distcp": 4000, "__1_0.distcp": 3000}


def write_save(parent: Path, step: int, fill: int | None = None, world: int = 2) -> Path:
    """A save directory as two ranks and Lightning leave it: shards, .metadata, meta.pt, parts."""
    save_dir = new_save_dir(parent)
    byte = bytes([fill if fill is not None else step % 256])
    for name, size in SHARDS.items():
        (save_dir / name).write_bytes(byte * size)
    (save_dir / ".metadata").write_bytes(b"M" + byte * 100)
    (save_dir / "meta.pt").write_bytes(b"P" + byte * 200)
    for rank in range(world):
        write_part(save_dir, rank, parts.hash_files(save_dir, parts.dcp_files_of(save_dir, rank)))
    return save_dir


def save(parent: Path, step: int, keep: int = 2, fill: int | None = None) -> Path:
    """Write and commit a checkpoint of ``step`` as ``parent/last.ckpt``."""
    save_dir = write_save(parent, step, fill)
    manifest = build_manifest(save_dir, 2, DCP_REQUIRED, global_step=step, saved_at=float(step))
    return commit_directory(save_dir, parent / "last.ckpt", manifest, keep)


def content(path: Path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in parts.list_files(path)}


def test_a_commit_writes_the_manifest_last_and_points_last_ckpt_at_the_directory(tmp_path: Path) -> None:
    final = save(tmp_path, 7)
    pointer = tmp_path / "last.ckpt"
    assert pointer.is_symlink() and os.readlink(pointer) == final.name  # relative: the folder can move
    assert final.name.startswith(".lr-ckpt-00000007-")
    manifest = read_manifest(final)
    assert manifest is not None
    assert [f.name for f in manifest.files] == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert {f.name: f.size for f in manifest.files}["__0_0.distcp"] == 4000
    assert (manifest.global_step, manifest.world_size, manifest.required) == (7, 2, DCP_REQUIRED)
    assert not list(final.glob(".lr-part-*"))
    assert verify(pointer, DIRECTORY).status is Status.VERIFIED


def test_retention_keeps_the_newest_and_the_pointer_target(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        save(tmp_path, step, keep=2)
    steps = sorted(read_manifest(p).global_step for p in tmp_path.glob(".lr-ckpt-*"))  # type: ignore[union-attr]
    assert steps == [3, 4]
    assert candidates(tmp_path / "last.ckpt")[0] == resolve_pointer(tmp_path / "last.ckpt")


KILL = """
import os, sys, types
package = types.ModuleType("lightning_resume")
package.__path__ = [{package!r}]
sys.modules["lightning_resume"] = package
from pathlib import Path
from lightning_resume.io.sharded import parts

parent, point = Path({parent!r}), {point!r}
def die(step):
    if step == point:
        os._exit(9)
save_dir = Path({save_dir!r})
manifest = parts.build_manifest(save_dir, 2, parts.DCP_REQUIRED, global_step=2, saved_at=2.0)
parts.commit_directory(save_dir, parent / "last.ckpt", manifest, 1, on_step=die)
"""


@pytest.mark.parametrize("point", COMMIT_STEPS)
def test_a_kill_at_any_step_of_the_commit_leaves_the_old_or_the_new_checkpoint(
    tmp_path: Path, point: str
) -> None:
    old = content(save(tmp_path, 1, fill=1))
    new_dir = write_save(tmp_path, 2, fill=2)
    new = content(new_dir)
    code = KILL.format(package=str(PACKAGE), parent=str(tmp_path), point=point, save_dir=str(new_dir))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr  # killed exactly there
    # What a restart does: clean up, then take the first candidate that verifies.
    clean_up(tmp_path / "last.ckpt", keep=1, restart=True)
    chosen = next(
        p for p in candidates(tmp_path / "last.ckpt") if verify(p, DIRECTORY).status is Status.VERIFIED
    )
    expected = new if point in ("after_swap", "mid_delete") else old
    assert content(chosen) == expected
    assert content(tmp_path / "last.ckpt") == expected
    # Nothing half-written is left; what is left verifies (a committed, not yet pointed-at directory
    # stays until the next save's retention).
    left = [p for p in tmp_path.iterdir() if p.name != "last.ckpt"]
    assert all(
        p.name.startswith(".lr-ckpt-") and verify(p, DIRECTORY).status is Status.VERIFIED for p in left
    ), left


def test_leftovers_of_dead_processes_are_removed_and_a_live_save_is_not(tmp_path: Path) -> None:
    save(tmp_path, 1)
    live = write_save(tmp_path, 2)  # this process: alive
    dead = tmp_path / ".lr-save-999999999-0badc0de"
    dead.mkdir()
    (dead / "__0_0.distcp").write_bytes(b"half")
    link = tmp_path / ".lr-tmp-999999999-00ff-last.ckpt.link"
    link.symlink_to("nowhere")
    half_deleted = tmp_path / ".lr-ckpt-00000000-00000000"  # its manifest went first
    half_deleted.mkdir()
    removed = clean_up(tmp_path / "last.ckpt", keep=2)
    assert sorted(removed) == sorted([dead.name, link.name, half_deleted.name])
    assert live.is_dir() and verify(tmp_path / "last.ckpt", DIRECTORY).status is Status.VERIFIED
    assert live.name in clean_up(tmp_path / "last.ckpt", keep=2, restart=True)


def fault(final: Path, kind: str, tmp_path: Path) -> None:
    """Damage a committed directory the way a kill, a bad copy or another writer could."""
    if kind == "mixed":  # rank 0's shard from another save: same size, other bytes
        (final / "__0_0.distcp").write_bytes(b"\x63" * SHARDS["__0_0.distcp"])
    elif kind == "truncated":
        with open(final / "__1_0.distcp", "r+b") as f:
            f.truncate(10)
    elif kind == "no .metadata":
        (final / ".metadata").unlink()
    elif kind == "no meta.pt":
        (final / "meta.pt").unlink()
    elif kind == "corrupt manifest":
        (final / MANIFEST_NAME).write_text("{garbage")
    elif kind == "no manifest":
        (final / MANIFEST_NAME).unlink()
    elif kind == "extra file":
        (final / "notes.txt").write_text("hi")


@pytest.mark.parametrize(
    ("kind", "cheap", "full"),
    [
        ("mixed", Status.VERIFIED, Status.CORRUPT),  # sizes cannot tell: checksums are required
        ("truncated", Status.TORN, Status.TORN),
        ("no .metadata", Status.INCOMPLETE, Status.INCOMPLETE),
        ("no meta.pt", Status.INCOMPLETE, Status.INCOMPLETE),
        ("corrupt manifest", Status.UNVERIFIABLE, Status.UNVERIFIABLE),
        ("no manifest", Status.NO_MANIFEST, Status.NO_MANIFEST),
        ("extra file", Status.VERIFIED, Status.VERIFIED),
    ],
)
def test_verification_rejects_every_damaged_directory(
    tmp_path: Path, kind: str, cheap: Status, full: Status
) -> None:
    final = save(tmp_path, 3)
    fault(final, kind, tmp_path)
    assert verify(final, DIRECTORY, checksums=False).status is cheap
    assert verify(final, DIRECTORY).status is full
    # Two ranks verifying their halves together find it too (each hashes every other file).
    shared = {verify(final, DIRECTORY, share=(rank, 2)).status for rank in range(2)}
    assert (full in shared) and shared <= {full, Status.VERIFIED}


def test_a_directory_missing_a_required_file_is_never_committed(tmp_path: Path) -> None:
    save_dir = write_save(tmp_path, 1)
    (save_dir / "meta.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"meta\.pt"):
        build_manifest(save_dir, 2, DCP_REQUIRED, global_step=1)
    with pytest.raises(FileNotFoundError, match=r"rank\(s\) \[2\]"):
        build_manifest(write_save(tmp_path, 2), 3, ())
    failed = write_save(tmp_path, 3)
    write_part(failed, 1, [], error="OSError: disk full")
    with pytest.raises(RuntimeError, match="rank 1 could not record its files: OSError: disk full"):
        parts.parts_complete(failed, 2)


def test_a_plain_lightning_directory_at_last_ckpt_is_replaced_by_the_pointer(tmp_path: Path) -> None:
    plain = tmp_path / "last.ckpt"
    plain.mkdir()
    (plain / "meta.pt").write_bytes(b"old")
    final = save(tmp_path, 5)
    assert plain.is_symlink() and resolve_pointer(plain) == final
    assert sorted(p.name for p in tmp_path.iterdir()) == [final.name, "last.ckpt"]


@pytest.mark.parametrize(
    "change",
    [
        {"files": [{"name": "../etc/passwd", "size": 1, "checksum": "ab"}]},
        {"files": [{"name": "/abs", "size": 1, "checksum": "ab"}]},
        {"global_step": 1e999},
        {"world_size": -1},
        {"format": "something else"},
        {"version": 99},
        {"saved_at": "yesterday"},
    ],
)
def test_a_manifest_with_bad_fields_is_unreadable(tmp_path: Path, change: dict[str, object]) -> None:
    final = save(tmp_path, 1)
    data = json.loads((final / MANIFEST_NAME).read_text())
    data.update(change)
    (final / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ValueError):
        DirectoryManifest.from_json((final / MANIFEST_NAME).read_bytes())
    assert verify(final, DIRECTORY).status is Status.UNVERIFIABLE
    assert final.name not in committed(LocalStore(tmp_path), DIRECTORY)
