"""Sidecar I/O and the place check: pure functions, no Trainer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lightning_resume.trackers.sidecar import (
    Sidecar,
    describe,
    environment_conflicts,
    place_conflicts,
    read_sidecar,
    sidecar_path,
    write_sidecar,
)


def test_sidecar_round_trips_identity_environment_and_step(tmp_path: Path) -> None:
    path = sidecar_path(tmp_path, "wandb")
    written = Sidecar({"id": "abc", "project": "p", "entity": None}, {"WANDB_PROJECT": None}, 12)
    write_sidecar(path, "wandb", written)
    assert path == tmp_path / "wandb_resume.json"
    assert read_sidecar(path, "wandb") == written
    assert not [p for p in tmp_path.iterdir() if p != path], "no temporary file left behind"


def test_missing_sidecar_reads_as_none(tmp_path: Path) -> None:
    assert read_sidecar(tmp_path / "wandb_resume.json", "wandb") is None


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"identity": {"id": "ab"', "is not valid JSON"),
        ("[]", "has no 'identity' object"),
        ('{"tracker": "swanlab", "identity": {"id": "ab"}}', "belongs to tracker 'swanlab'"),
        ('{"tracker": "wandb", "identity": {"id": ""}}', "has no usable 'id'"),
        ('{"tracker": "wandb", "identity": {"project": "p"}}', "has no usable 'id'"),
    ],
)
def test_unusable_sidecar_says_why(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "wandb_resume.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=problem):
        read_sidecar(path, "wandb")


def test_unreadable_sidecar_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "wandb_resume.json"
    path.mkdir()  # reading a directory fails with an OSError
    with pytest.raises(ValueError, match="cannot read"):
        read_sidecar(path, "wandb")


def test_required_fields_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "trackio_resume.json"
    path.write_text(json.dumps({"tracker": "trackio", "identity": {"id": "x", "name": None}}))
    with pytest.raises(ValueError, match="'name'"):
        read_sidecar(path, "trackio", required=("id", "name"))


def test_place_conflicts_compare_only_what_both_sides_know(tmp_path: Path) -> None:
    recorded = {"project": "a", "entity": None, "mode": "offline", "dir": str(tmp_path)}
    assert place_conflicts(recorded, {"project": None, "entity": "team"}, ("project", "entity")) == []
    assert place_conflicts(recorded, {"project": "b"}, ("project", "mode")) == [("project", "a", "b")]
    assert place_conflicts(recorded, {"entity": "team"}, ("entity",), known_only=False) == [
        ("entity", None, "team")
    ]


def test_place_conflicts_resolve_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    recorded = {"dir": str(tmp_path / "logs")}
    assert place_conflicts(recorded, {"dir": "logs"}, ("dir",)) == []
    assert place_conflicts(recorded, {"dir": os.fspath(tmp_path / "other")}, ("dir",))


def test_environment_conflicts_cover_set_unset_and_changed_variables() -> None:
    recorded = {"WANDB_PROJECT": "a", "WANDB_ENTITY": None, "WANDB_MODE": "offline"}
    now = {"WANDB_PROJECT": "b", "WANDB_ENTITY": "team", "WANDB_MODE": "offline", "WANDB_DIR": "/x"}
    conflicts = environment_conflicts(recorded, now)
    assert conflicts == [("WANDB_PROJECT", "a", "b"), ("WANDB_ENTITY", None, "team")]
    assert (
        describe(conflicts)
        == "WANDB_PROJECT 'a' (recorded) vs 'b' (now), WANDB_ENTITY None (recorded) vs 'team' (now)"
    )
