"""The saved-configuration comparison (pure) and the Hydra output-dir rule (pure), no Trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_resume.run_dir import saved_config
from lightning_resume.run_dir.hydra import HydraLaunch, root_lost_on_restart


def test_changes_name_every_changed_leaf_as_a_dotted_path() -> None:
    before = {
        "trainer": {"max_steps": 30, "callbacks": [{"class_path": "A", "init_args": {"root": "runs"}}]},
        "model": {"lr": 0.01},
        "ckpt_path": None,
    }
    now = {
        "trainer": {"max_steps": 40, "callbacks": [{"class_path": "A", "init_args": {"root": "other"}}]},
        "model": {"lr": 0.01, "dropout": 0.1},
        "ckpt_path": "last",  # ignored: RequeueCheckpoint resumes from last.ckpt whatever it says
    }
    found = saved_config.changes(before, now)
    assert found == [
        ("model.dropout", saved_config.ABSENT, 0.1),
        ("trainer.callbacks[0].init_args.root", "runs", "other"),
        ("trainer.max_steps", 30, 40),
    ]
    assert saved_config.describe(found, limit=2) == (
        "model.dropout: '<absent>' -> 0.1, trainer.callbacks[0].init_args.root: 'runs' -> 'other', "
        "... (1 more)"
    )
    assert saved_config.changes(before, before) == []
    assert saved_config.changes({"a": {}}, {"a": []}) == [("a", {}, [])]


def test_read_config_and_kept_names(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    assert saved_config.read_config(path) is None
    path.write_text("a: 1\n")
    assert saved_config.read_config(path) == {"a": 1}
    path.write_text("- not a mapping\n")
    with pytest.raises(ValueError, match="does not hold a YAML mapping"):
        saved_config.read_config(path)
    path.write_text("a: [unclosed\n")
    with pytest.raises(ValueError, match="is not valid YAML"):
        saved_config.read_config(path)
    assert saved_config.kept_name(path) == tmp_path / "config.1.yaml"
    (tmp_path / "config.1.yaml").touch()
    assert saved_config.kept_name(path) == tmp_path / "config.2.yaml"


BASIC = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
SUBMITIT = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


@pytest.mark.parametrize(
    ("root", "launcher", "lost"),
    [
        ("outputs/2026-01-01/12-00-00/runs", BASIC, True),
        ("runs", BASIC, False),
        # hydra-submitit-launcher fixes the output dir at submission: a requeued job finds it again.
        ("outputs/2026-01-01/12-00-00/runs", SUBMITIT, False),
    ],
)
def test_a_root_inside_hydras_output_dir_is_lost_unless_the_launcher_keeps_it(
    tmp_path: Path, root: str, launcher: str, lost: bool
) -> None:
    launch = HydraLaunch(tmp_path / "outputs/2026-01-01/12-00-00", True, launcher)
    assert root_lost_on_restart(tmp_path / root, launch) is lost
