"""The runs root's layout: run dirs straight under the root (``runs/YYYYMMDD/HHMMSS/<id>`` for
``RunDir(root="runs")``), and run dirs that earlier versions put one folder deeper
(``<root>/runs/YYYYMMDD/HHMMSS/<id>``) still found, resumed, inspected and collected."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from conftest import tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import RequeueCheckpoint, RunDir
from lightning_resume._scheduler.environment import read_session
from lightning_resume.cli import gc, inspect
from lightning_resume.cli import main as cli
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.resolve import index_path, read_index, resolve

KEY = read_session({"LIGHTNING_RESUME_KEY": "k"})


def as_earlier_version(root: Path, run_dir: Path, absolute: bool = False) -> Path:
    """Move ``run_dir`` where earlier versions put it (``root/runs/...``), its index entry with it.

    Versions before relative entries wrote the absolute path (``absolute``)."""
    legacy = root / layout.LEGACY_RUNS / run_dir.relative_to(root)
    legacy.parent.mkdir(parents=True)
    run_dir.rename(legacy)
    shutil.rmtree(root / run_dir.relative_to(root).parts[0])  # the emptied date folder
    entry = str(legacy) if absolute else legacy.relative_to(root).as_posix()
    index_path(root, "k").write_text(f"{entry}\n")
    return legacy


def test_runs_go_straight_under_the_root_the_user_gives(tmp_path: Path) -> None:
    found = resolve(tmp_path / "runs", KEY)
    day, time, run_id = found.path.relative_to(tmp_path / "runs").parts
    assert (len(day), len(time), run_id) == (8, 6, found.run_id)
    assert layout.run_dirs(tmp_path / "runs") == [found.path]
    assert layout.root_of(found.path) == tmp_path / "runs"
    assert read_index(tmp_path / "runs", "k") == found.path
    assert index_path(tmp_path / "runs", "k").read_text() == f"{day}/{time}/{run_id}\n"


@pytest.mark.parametrize("absolute", [False, True], ids=["relative-entry", "absolute-entry"])
def test_a_run_dir_of_an_earlier_version_is_resumed_where_it_is(tmp_path: Path, absolute: bool) -> None:
    root = tmp_path / "runs"
    legacy = as_earlier_version(root, resolve(root, KEY).path, absolute)
    again = resolve(root, KEY)
    assert (again.path, again.is_resumed) == (legacy, True)
    assert layout.run_dirs(root) == [legacy] and layout.root_of(legacy) == root


def test_an_earlier_versions_run_dir_without_its_entry_is_found_by_its_key(tmp_path: Path) -> None:
    legacy = as_earlier_version(tmp_path, resolve(tmp_path, KEY).path)
    index_path(tmp_path, "k").unlink()
    again = resolve(tmp_path, KEY)
    assert (again.path, again.is_resumed) == (legacy, True)
    assert read_index(tmp_path, "k") == legacy


def test_a_new_run_beside_an_earlier_versions_run_goes_straight_under_the_root(tmp_path: Path) -> None:
    legacy = as_earlier_version(tmp_path, resolve(tmp_path, KEY).path)
    fresh = resolve(tmp_path, read_session({"LIGHTNING_RESUME_KEY": "other"}))
    assert fresh.path.parents[2] == tmp_path and not fresh.is_resumed
    assert layout.run_dirs(tmp_path) == sorted([legacy, fresh.path])


def test_places_of_both_layouts_and_nothing_else_are_run_places(tmp_path: Path) -> None:
    for relative, expected in [
        ("20260101/120000/abc", True),
        ("runs/20260101/120000/abc", True),
        ("runs/20260101/abc", False),
        ("2026011/120000/abc", False),
        ("other/20260101/120000/abc", False),
        ("20260101/120000/abc/checkpoints", False),
    ]:
        assert layout.is_run_place(tmp_path, tmp_path / relative) is expected, relative
    assert not layout.is_run_place(tmp_path / "a", tmp_path / "b" / "20260101" / "120000" / "abc")


class FirstStep(pl.Callback):
    def __init__(self) -> None:
        self.step: int | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.step = trainer.global_step if self.step is None else self.step


def test_training_resumes_from_an_earlier_versions_run_dir_and_the_tools_see_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    first = RunDir(root=root, key="k")
    tiny_trainer(first, RequeueCheckpoint(), tmp_path=tmp_path, max_steps=2, max_epochs=2).fit(BoringModel())
    legacy = as_earlier_version(root, first.path)

    again, seen = RunDir(root=root, key="k"), FirstStep()
    trainer = tiny_trainer(again, RequeueCheckpoint(), seen, tmp_path=tmp_path, max_steps=4, max_epochs=2)
    trainer.fit(BoringModel())
    assert (again.path, again.is_resumed, seen.step, trainer.global_step) == (legacy, True, 2, 4)

    fresh = RunDir(root=root, key="new")
    tiny_trainer(fresh, RequeueCheckpoint(), tmp_path=tmp_path, max_steps=1).fit(BoringModel())
    assert fresh.path.parents[2] == root

    capsys.readouterr()
    assert cli(["inspect", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    listed = {run["path"]: (run["session_key"], run["indexed"], run["last_step"]) for run in report["runs"]}
    assert listed == {str(legacy): ("k", True, 4), str(fresh.path): ("new", True, 1)}
    assert inspect.describe_run(legacy)["index_entries"] == ["k"]  # its root found above runs/

    # gc finds the finished runs of both layouts by their index entries.
    later = time.time() + 10 * 86400
    assert {Path(r.path).name for r in gc.plan(root, older_than=86400, now=later)} == {"k", "new"}
    assert cli(["gc", str(root), "--older-than", "1d", "--json"]) == 0
    capsys.readouterr()

    # A root that only holds an earlier version's runs is a root to the tools.
    shutil.rmtree(root / fresh.path.relative_to(root).parts[0])
    shutil.rmtree(root / layout.INDEX_DIR)
    assert layout.is_root(root) and cli(["gc", str(root), "--json"]) == 0
