"""One rule for which checkpoints count and in which order a load falls back, local and remote alike."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lightning_resume._storage.catalog import Status, check_file, scan, verify
from lightning_resume._storage.commit import commit_file, committed, newest_first
from lightning_resume._storage.kinds import FILE
from lightning_resume._storage.manifest import Entry, manifest_path
from lightning_resume._storage.mirror import Mirroring
from lightning_resume._storage.store import LocalStore
from lightning_resume._storage.writer import Aside


def save(folder: Path, name: str, data: bytes, saved_at: float, step: int | None = None) -> Entry:
    aside = Aside(folder / name, direct=False)
    with aside as out:
        out.write(data)
    return commit_file(aside, {"global_step": step, "saved_at": saved_at})[0]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    # The newest save is not the highest step: the order must follow the save time.
    save(folder, "epoch=1-step=100.ckpt", b"a" * 100, saved_at=1000.0, step=100)
    save(folder, "epoch=0-step=50.ckpt", b"b" * 50, saved_at=2000.0, step=50)
    save(folder, "last.ckpt", b"c" * 70, saved_at=1500.0, step=70)
    (folder / "plain.ckpt").write_bytes(b"no manifest")
    return folder


def test_committed_checkpoints_are_listed_newest_save_first(folder: Path) -> None:
    found = scan(folder)
    assert sorted(found) == ["epoch=0-step=50.ckpt", "epoch=1-step=100.ckpt", "last.ckpt"]
    assert newest_first(found) == ["epoch=0-step=50.ckpt", "last.ckpt", "epoch=1-step=100.ckpt"]
    assert newest_first(found, exclude=["last.ckpt"]) == ["epoch=0-step=50.ckpt", "epoch=1-step=100.ckpt"]


def test_a_mirror_of_the_same_files_counts_the_same_checkpoints(folder: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    shutil.copytree(folder, remote)
    mirror = Mirroring(f"file://{remote}")
    assert mirror.committed(FILE) == committed(LocalStore(folder), FILE)


def test_a_torn_file_is_not_committed_and_does_not_verify(folder: Path) -> None:
    with open(folder / "last.ckpt", "ab") as handle:
        handle.write(b"tail")
    assert "last.ckpt" not in scan(folder)
    assert check_file(folder / "last.ckpt").status is Status.TORN


def test_verdicts_name_what_is_wrong(folder: Path) -> None:
    assert check_file(folder / "last.ckpt").status is Status.VERIFIED
    assert check_file(folder / "plain.ckpt").status is Status.NO_MANIFEST
    assert check_file(folder / "missing.ckpt").status is Status.MISSING
    (folder / "epoch=1-step=100.ckpt").write_bytes(b"x" * 100)
    corrupt = check_file(folder / "epoch=1-step=100.ckpt")
    assert corrupt.status is Status.CORRUPT and "checksum" in corrupt.reason
    manifest_path(folder / "last.ckpt").write_text("{garbage")
    unverifiable = verify(folder / "last.ckpt", FILE, checksums=False)
    assert unverifiable.status is Status.UNVERIFIABLE
    assert "delete the manifest" in unverifiable.reason


def test_a_checkpoint_removed_while_its_checksum_is_read_is_missing_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lightning-resume inspect`` during training: retention deletes a checkpoint it is hashing."""
    from lightning_resume._storage import catalog

    path = tmp_path / "last.ckpt"
    save(tmp_path, path.name, b"x" * 1000, saved_at=3.0)
    real = catalog.checksum_file

    def removed_first(target: Path) -> tuple[int, str]:
        Path(target).unlink()  # the job's pruning gets there between the size check and the hash
        return real(target)

    monkeypatch.setattr(catalog, "checksum_file", removed_first)
    verdict = verify(path, FILE)
    assert verdict.status is Status.INCOMPLETE and "removed while checked" in verdict.detail
