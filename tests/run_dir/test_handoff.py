"""Rank 0's run dir reaches the other ranks of its launch, and never those of another launch."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from lightning_resume._scheduler.environment import read_session
from lightning_resume.exceptions import RunDirError
from lightning_resume.run_dir import handoff, layout
from lightning_resume.run_dir.owner import is_gone
from lightning_resume.run_dir.resolve import Resolution, resolve

FIRST = read_session({"SLURM_JOB_ID": "42"})


def test_a_request_is_answered_with_rank_zeros_choice_and_both_files_go(tmp_path: Path) -> None:
    chosen = resolve(tmp_path, FIRST)
    answerer = handoff.Answerer(tmp_path, "launch", chosen)
    try:
        assert handoff.ask(tmp_path, "launch", rank=1, timeout=10) == chosen
    finally:
        answerer.stop()
    assert list((tmp_path / layout.HANDOFF_DIR).iterdir()) == []


def test_a_request_made_before_rank_zero_comes_up_waits_for_it(tmp_path: Path) -> None:
    chosen = resolve(tmp_path, FIRST)
    got: list[Resolution] = []
    asking = threading.Thread(target=lambda: got.append(handoff.ask(tmp_path, "launch", 1, timeout=20)))
    asking.start()
    while not list((tmp_path / layout.HANDOFF_DIR).glob("*.ask")):
        asking.join(0.01)
    answerer = handoff.Answerer(tmp_path, "launch", chosen)
    asking.join()
    answerer.stop()
    assert got == [chosen]


def test_files_an_earlier_launch_of_the_same_key_left_are_never_taken(tmp_path: Path) -> None:
    earlier = resolve(tmp_path, FIRST)
    folder = tmp_path / layout.HANDOFF_DIR
    folder.mkdir()
    # What the launch before left: an answer, a request nobody answered, the old single file, garbage.
    record = {**json.loads(earlier.to_json()), "written": 1e12}
    (folder / "launch.0123.answer").write_text(json.dumps(record))
    (folder / "launch.4567.ask").write_text("{}")
    (folder / "launch").write_text(json.dumps(record))
    (folder / "launch.89ab.answer").write_text("{garbage")
    with pytest.raises(RunDirError, match=r"Rank 0 did not publish its run dir.*within 0 s"):
        handoff.ask(tmp_path, "launch", rank=1, timeout=0.3)
    assert sorted(p.name for p in folder.glob("*.ask")) == ["launch.4567.ask"]  # its own withdrawn


def test_rank_zero_answers_only_requests_of_its_own_launch_key(tmp_path: Path) -> None:
    chosen = resolve(tmp_path, FIRST)
    answerer = handoff.Answerer(tmp_path, "launch-a", chosen)
    try:
        with pytest.raises(RunDirError, match="did not publish"):
            handoff.ask(tmp_path, "launch-b", rank=1, timeout=0.3)
    finally:
        answerer.stop()


def test_every_handoff_file_names_its_writer_for_gc(tmp_path: Path) -> None:
    chosen = resolve(tmp_path, FIRST)
    folder = tmp_path / layout.HANDOFF_DIR
    answerer = handoff.Answerer(tmp_path, "launch", chosen)
    answerer.stop()  # answer by hand, while the request is in place
    (folder / "launch.cafe.ask").write_text(json.dumps({"rank": 1, "writer": {"pid": 1}}))
    assert answerer.answer_waiting() == 1
    writer = handoff.writer_of(folder / "launch.cafe.answer")
    assert not is_gone(writer) and writer["pid"] > 1


def test_a_file_where_the_handoff_folder_belongs_is_one_clear_error(tmp_path: Path) -> None:
    chosen = resolve(tmp_path, FIRST)
    (tmp_path / layout.HANDOFF_DIR).write_text("")
    with pytest.raises(RunDirError, match="Cannot publish this launch's run dir"):
        handoff.Answerer(tmp_path, "launch", chosen)
