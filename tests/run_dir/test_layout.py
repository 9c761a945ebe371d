"""The runs root's layout: run dirs straight under the root (``runs/YYYYMMDD/HHMMSS/<id>`` for
``RunDir(root="runs")``), recorded in the index relative to the root."""

from __future__ import annotations

from pathlib import Path

from lightning_resume._scheduler.environment import read_session
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.resolve import index_path, read_index, resolve

KEY = read_session({"LIGHTNING_RESUME_KEY": "k"})


def test_runs_go_straight_under_the_root_the_user_gives(tmp_path: Path) -> None:
    found = resolve(tmp_path / "runs", KEY)
    day, time, run_id = found.path.relative_to(tmp_path / "runs").parts
    assert (len(day), len(time), run_id) == (8, 6, found.run_id)
    assert layout.run_dirs(tmp_path / "runs") == [found.path]
    assert layout.root_of(found.path) == tmp_path / "runs"
    assert layout.is_root(tmp_path / "runs") and not layout.is_root(tmp_path)
    assert read_index(tmp_path / "runs", "k") == found.path
    assert index_path(tmp_path / "runs", "k").read_text() == f"{day}/{time}/{run_id}\n"


def test_only_the_place_of_a_run_dir_is_a_run_place(tmp_path: Path) -> None:
    for relative, expected in [
        ("20260101/120000/abc", True),
        ("runs/20260101/120000/abc", False),
        ("2026011/120000/abc", False),
        ("other/20260101/120000/abc", False),
        ("20260101/120000/abc/checkpoints", False),
    ]:
        assert layout.is_run_place(tmp_path, tmp_path / relative) is expected, relative
    assert not layout.is_run_place(tmp_path / "a", tmp_path / "b" / "20260101" / "120000" / "abc")


def test_an_absolute_entry_names_its_dir_as_written(tmp_path: Path) -> None:
    found = resolve(tmp_path / "runs", KEY)
    index_path(tmp_path / "runs", "k").write_text(f"{found.path}\n")
    assert read_index(tmp_path / "runs", "k") == found.path
    index_path(tmp_path / "runs", "k").write_text(f"{tmp_path / 'elsewhere'}\n")
    assert read_index(tmp_path / "runs", "k") == tmp_path / "elsewhere"  # not looked up under the root
