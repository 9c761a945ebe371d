from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lightning_resume._run.layout import RUN_META
from lightning_resume._run.resolve import (
    check_index,
    create_run,
    index_path,
    key_filename,
    publish_handoff,
    read_index,
    resolve,
    wait_for_handoff,
)
from lightning_resume._run.scheduler import read_session
from lightning_resume.exceptions import LightningResumeWarning, RunDirError

FIRST = read_session({"SLURM_JOB_ID": "42"})
RESTART = read_session({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"})


def test_fresh_run_creates_dated_dir_meta_and_index(tmp_path: Path) -> None:
    res = resolve(tmp_path, FIRST)
    assert not res.is_resumed
    assert res.path.relative_to(tmp_path).parts[0] == "runs"
    assert len(res.path.relative_to(tmp_path).parts) == 4
    meta = json.loads((res.path / RUN_META).read_text())
    assert meta["run_id"] == res.run_id == res.path.name
    assert meta["session_key"] == "42"
    assert meta["scheduler_ids"] == {"slurm_job_id": "42"}
    assert {"host", "created", "lightning_resume_version"} <= meta.keys()
    assert read_index(tmp_path, "42") == res.path


def test_restart_reuses_the_indexed_dir(tmp_path: Path) -> None:
    first = resolve(tmp_path, FIRST)
    again = resolve(tmp_path, RESTART)
    assert again.is_resumed
    assert (again.path, again.run_id) == (first.path, first.run_id)


def test_interactive_rerun_in_one_allocation_gets_a_new_dir_and_keeps_the_index(tmp_path: Path) -> None:
    first = resolve(tmp_path, FIRST)
    rerun = resolve(tmp_path, FIRST)
    assert rerun.path != first.path and not rerun.is_resumed
    assert read_index(tmp_path, "42") == first.path
    assert "already belongs to" in rerun.reason
    assert first.owns_index and not rerun.owns_index


def test_restart_with_nothing_recorded_starts_fresh_with_a_warning(tmp_path: Path) -> None:
    with pytest.warns(LightningResumeWarning, match="stopped before it wrote anything"):
        res = resolve(tmp_path, RESTART)
    assert not res.is_resumed
    assert read_index(tmp_path, "42") == res.path


def test_restart_with_missing_index_but_stamped_orphan_is_an_error(tmp_path: Path) -> None:
    orphan, _ = create_run(tmp_path, FIRST)
    with pytest.raises(RunDirError, match="died before recording it") as err:
        resolve(tmp_path, RESTART)
    assert str(orphan) in str(err.value)
    assert "Write the right run dir into the index entry" in str(err.value)


def test_orphans_of_other_keys_do_not_count(tmp_path: Path) -> None:
    create_run(tmp_path, read_session({"SLURM_JOB_ID": "7"}))
    assert not resolve(tmp_path, RESTART).is_resumed


def test_index_pointing_at_a_missing_dir_is_an_error(tmp_path: Path) -> None:
    first = resolve(tmp_path, FIRST)
    (first.path / RUN_META).unlink()
    first.path.rmdir()
    with pytest.raises(RunDirError, match="does not exist") as err:
        resolve(tmp_path, RESTART)
    assert "delete the index entry to start a fresh run" in str(err.value)


def test_empty_index_entry_is_an_error(tmp_path: Path) -> None:
    entry = index_path(tmp_path, "42")
    entry.parent.mkdir(parents=True)
    entry.write_text("")
    with pytest.raises(RunDirError, match="is empty"):
        resolve(tmp_path, RESTART)


def test_explicit_key_resumes_when_indexed(tmp_path: Path) -> None:
    session = read_session({}, key="k8s-job")
    first = resolve(tmp_path, session)
    again = resolve(tmp_path, session)
    assert not first.is_resumed and again.is_resumed and again.path == first.path


def test_keys_become_safe_file_names() -> None:
    assert key_filename("12_3") == "12_3"
    assert "/" not in key_filename("a/b c")
    assert key_filename("a/b") != key_filename("a_b")


def test_guard_accepts_own_entry_and_names_the_problem_otherwise(tmp_path: Path) -> None:
    first = resolve(tmp_path, FIRST)
    check_index(tmp_path, "42", first.path)
    second = resolve(tmp_path, FIRST)
    with pytest.raises(RunDirError, match="should point at this run") as err:
        check_index(tmp_path, "42", second.path)
    assert str(first.path) in str(err.value)
    with pytest.raises(RunDirError, match="is missing"):
        check_index(tmp_path, "other", second.path)


def test_handoff_roundtrip_and_stale_handoff_ignored(tmp_path: Path) -> None:
    res = resolve(tmp_path, FIRST)
    publish_handoff(tmp_path, "launch", res)
    assert wait_for_handoff(tmp_path, "launch", timeout=1, not_before=0) == res
    with pytest.raises(RunDirError, match="did not publish its run dir"):
        wait_for_handoff(tmp_path, "launch", timeout=0.2, not_before=time.time() + 10)
