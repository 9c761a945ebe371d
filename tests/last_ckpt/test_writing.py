"""RequeueCheckpoint with a strategy that saves directories: commit, resume, fallback, failures (in-process).

The 2-rank ``ModelParallelStrategy`` end-to-end tests are in ``tests/io/test_sharded_checkpoints.py``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from _sharded import SHARD, DirectoryStrategy, fit_directories

from lightning_resume import ResumeError
from lightning_resume._storage.catalog import Status, candidates, verify
from lightning_resume._storage.kinds import COMMITTED_PREFIX, DIRECTORY
from lightning_resume._storage.store import LocalStore
from lightning_resume.cli.inspect import describe_run
from lightning_resume.io.sharded.parts import read_manifest
from lightning_resume.run_dir import layout


def test_each_save_is_a_committed_directory_that_last_ckpt_links_to(tmp_path: Path) -> None:
    run, _, _ = fit_directories(tmp_path, steps=3)
    folder = layout.checkpoint_dir(run.path)
    last = folder / layout.LAST_CKPT
    assert last.is_symlink() and os.readlink(last).startswith(COMMITTED_PREFIX)
    verdict = verify(last, DIRECTORY)
    assert verdict.status is Status.VERIFIED and verdict.manifest is not None
    assert verdict.manifest.global_step == 3
    assert [f.name for f in verdict.manifest.files] == [SHARD, "meta.pt"]
    # The previous save stays as the fallback; nothing else (no save directory, no temporary link).
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [layout.LAST_CKPT, *DIRECTORY.names(LocalStore(folder).sizes(deep=True))]
    )
    assert len(DIRECTORY.names(LocalStore(folder).sizes(deep=True))) == 2
    assert describe_run(run.path)["next_restart_loads"]["checkpoint"] == layout.LAST_CKPT


def test_a_restart_resumes_from_the_directory_last_ckpt_names(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=2)
    user_path = candidates(layout.last_checkpoint(first.path))[1]  # an older save
    with pytest.warns(UserWarning, match="resuming from .*last.ckpt' instead of"):
        again, started, strategy = fit_directories(tmp_path, steps=4, ckpt_path=user_path)
    assert again.path == first.path and again.is_resumed
    assert started.step == 2
    assert strategy.loaded == [str(layout.last_checkpoint(first.path))]


def test_a_torn_directory_falls_back_to_the_previous_one_with_one_warning(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=2)
    last = layout.last_checkpoint(first.path)
    torn, previous = candidates(last)[:2]
    manifest = read_manifest(previous)
    assert manifest is not None
    with open(torn / SHARD, "r+b") as f:
        f.truncate(10)
    with pytest.warns(UserWarning, match=r"checkpoint directory that did not verify: .*torn") as caught:
        _, started, _ = fit_directories(tmp_path, steps=4)
    assert len([w for w in caught if "did not verify" in str(w.message)]) == 1
    assert started.step == manifest.global_step  # the save before
    assert not torn.exists()


def test_a_link_to_a_deleted_directory_is_a_lost_checkpoint(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=2)
    shutil.rmtree(layout.last_checkpoint(first.path).resolve())
    assert describe_run(first.path)["checkpoints"][0]["result"] == "missing"
    with pytest.raises(ResumeError, match="does not exist although the run has saved checkpoints"):
        fit_directories(tmp_path, steps=4)


def test_a_failed_directory_save_raises_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="No space left on device"):
        fit_directories(tmp_path, steps=3, strategy=DirectoryStrategy(fail_at_save=2))
    (run_dir,) = (tmp_path / "root").glob(layout.RUN_GLOB)
    last = layout.last_checkpoint(run_dir)
    verdict = verify(last, DIRECTORY)
    assert verdict.status is Status.VERIFIED and verdict.manifest is not None
    assert verdict.manifest.global_step == 1
