from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lightning_resume._scheduler.environment import read_session
from lightning_resume.exceptions import LightningResumeWarning, RunDirError
from lightning_resume.run_dir.layout import RUN_META
from lightning_resume.run_dir.resolve import (
    check_index,
    create_run,
    entry_target,
    index_path,
    key_filename,
    read_index,
    resolve,
)

FIRST = read_session({"SLURM_JOB_ID": "42"})
RESTART = read_session({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"})


def test_fresh_run_creates_dated_dir_meta_and_index(tmp_path: Path) -> None:
    res = resolve(tmp_path, FIRST)
    assert not res.is_resumed
    day, time, _ = res.path.relative_to(tmp_path).parts  # straight under the root
    assert len(day) == 8 and day.isdigit() and len(time) == 6 and time.isdigit()
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


def test_restart_with_missing_index_resumes_the_one_stamped_dir_and_records_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    orphan, _, lock = create_run(tmp_path, FIRST)
    lock.release()
    res = resolve(tmp_path, RESTART)
    assert res.is_resumed and res.path == orphan and res.owns_index
    assert index_path(tmp_path, "42").read_text() == f"{orphan.relative_to(tmp_path).as_posix()}\n"
    assert [r.message for r in caplog.records if "no index entry" in r.message] != []


def test_missing_index_with_several_stamped_dirs_is_an_error(tmp_path: Path) -> None:
    dirs = [create_run(tmp_path, FIRST) for _ in range(2)]
    for _, _, lock in dirs:
        lock.release()
    with pytest.raises(RunDirError, match="2 run dirs are stamped with this key") as err:
        resolve(tmp_path, RESTART)
    assert all(str(path) in str(err.value) for path, _, _ in dirs)
    assert not index_path(tmp_path, "42").exists()


def test_missing_index_with_an_unreadable_run_meta_is_an_error(tmp_path: Path) -> None:
    damaged, _, lock = create_run(tmp_path, read_session({"SLURM_JOB_ID": "7"}))
    lock.release()
    (damaged / RUN_META).write_text("{trunc")
    with pytest.raises(RunDirError, match="cannot be read: that run dir may be this session's own run"):
        resolve(tmp_path, RESTART)


def test_entries_are_relative_and_an_absolute_one_names_its_dir(tmp_path: Path) -> None:
    first = resolve(tmp_path, FIRST)
    entry = index_path(tmp_path, "42")
    assert not Path(entry.read_text().strip()).is_absolute()
    entry.write_text(f"{first.path}\n")  # written by hand
    assert resolve(tmp_path, RESTART).path == first.path
    assert entry_target(tmp_path, "runs/20260101/120000/abc") == tmp_path / "runs/20260101/120000/abc"
    assert entry_target(tmp_path, "/etc") == Path("/etc")


def test_a_run_meta_of_another_run_is_refused(tmp_path: Path) -> None:
    first = resolve(tmp_path, FIRST)
    meta = json.loads((first.path / RUN_META).read_text())
    (first.path / RUN_META).write_text(json.dumps({**meta, "run_id": "0123456789ab"}))
    with pytest.raises(RunDirError, match="belongs to run '0123456789ab'"):
        resolve(tmp_path, RESTART)


def test_orphans_of_other_keys_do_not_count(tmp_path: Path) -> None:
    create_run(tmp_path, read_session({"SLURM_JOB_ID": "7"}))[2].release()
    assert not resolve(tmp_path, RESTART).is_resumed


def test_index_pointing_at_a_missing_dir_is_an_error(tmp_path: Path) -> None:
    first = resolve(tmp_path, FIRST)
    shutil.rmtree(first.path)
    with pytest.raises(RunDirError, match="does not exist") as err:
        resolve(tmp_path, RESTART)
    assert "delete the entry to start a fresh run" in str(err.value)


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
