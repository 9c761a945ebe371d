"""CometResume: one Comet experiment (one key) across restarts, steps continuous, read back from Comet's
own offline archives; the lazily starting CometLogger is built before the callbacks, as LightningCLI does."""

from __future__ import annotations

import json
import random
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch
from _tracker_data import (
    dead_network_env,
    fit_tiny,
    offline_env,
    only_run_dir,
    read_sidecar_file,
    run_tracker_job,
)

from lightning_resume import CometResume, LightningResumeWarning
from lightning_resume.run_dir.binding import PROCESS

pytest.importorskip("comet_ml")

STEPS = 16


def archives(folder: Path) -> list[tuple[str, list[int]]]:
    """``(experiment key, echo steps)`` of every offline archive in ``folder``, oldest first."""
    found = []
    for archive in sorted(folder.glob("*.zip"), key=lambda p: p.stat().st_mtime):
        with zipfile.ZipFile(archive) as z:
            if "experiment.json" not in z.namelist():
                found.append(("", []))  # an attempt killed before Comet wrote its archive
                continue
            key = json.loads(z.read("experiment.json"))["offline_id"]
            steps = []
            for line in z.read("messages.json").decode().splitlines():
                payload = json.loads(line).get("payload")
                metric = payload.get("metric") if isinstance(payload, dict) else None
                if metric and metric.get("metricName") == "echo":
                    steps.append(int(metric["step"]))
        found.append((key, steps))
    return found


@pytest.mark.long
def test_one_comet_experiment_through_two_preemptions(tmp_path: Path) -> None:
    rng = random.Random()
    first = rng.randint(2, 6)
    second = rng.randint(first + 2, STEPS - 3)
    for attempt, step in enumerate((first, second, None)):
        args = ["--steps", STEPS, "--every", 2] + (["--kill-at", step] if step is not None else [])
        result = run_tracker_job(
            tmp_path, "comet", *args, SLURM_JOB_ID=81, SLURM_RESTART_COUNT=attempt or None
        )
        assert result.returncode == 0, result.output[-3000:]
        assert result.finished == (step is None)
    found = archives(tmp_path / "trackers" / "comet")
    keys = {key for key, _ in found}
    recorded = read_sidecar_file(only_run_dir(tmp_path), "comet")["identity"]
    assert keys == {recorded["id"]}, found  # three archives, one experiment
    assert len(found) == 3
    assert [step for _, steps in found for step in steps] == list(range(STEPS)), (first, second, found)
    assert (recorded["project"], recorded["mode"]) == ("resume-test", "offline")
    checkpoint = torch.load(only_run_dir(tmp_path) / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["callbacks"]["CometResume"]["identity"]["id"] == recorded["id"]


@pytest.fixture
def comet_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, value in {**offline_env(tmp_path), **dead_network_env()}.items():
        if name.startswith("COMET") or name.lower().endswith("proxy"):
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # Comet's per-experiment temporary data
    return tmp_path / "comet"


def test_lightnings_comet_logger_built_before_the_callbacks_cannot_continue(comet_offline: Path) -> None:
    from lightning.pytorch.loggers import CometLogger

    root = comet_offline.parent / "root"
    first = CometLogger(project="p", offline_directory=str(comet_offline))
    fit_tiny(root, first, CometResume(), steps=2)
    first.experiment.end()  # as the process exit would: comet_ml.start would reuse a running experiment
    PROCESS.reset()  # a new process: the restart
    logger = CometLogger(
        project="p", offline_directory=str(comet_offline)
    )  # started now, before the callbacks
    with pytest.warns(LightningResumeWarning, match="construct RunDir and CometResume before it"):
        fit_tiny(root, logger, CometResume(), steps=4)
    logger.experiment.end()


def test_a_restart_for_another_project_gets_a_new_experiment(comet_offline: Path) -> None:
    from lightning_resume.loggers import CometLogger

    root = comet_offline.parent / "root"
    first = CometLogger(project="a", offline_directory=str(comet_offline))
    fit_tiny(root, first, CometResume(project="a"), steps=2)
    first.experiment.end()
    PROCESS.reset()
    again = CometLogger(project="b", offline_directory=str(comet_offline))
    with pytest.warns(
        LightningResumeWarning, match=r"not continuing comet run .*project 'a' \(recorded\) vs 'b'"
    ):
        fit_tiny(root, again, CometResume(project="b"), steps=4)
    assert again.experiment.get_key() != first.experiment.get_key()
    assert again.experiment.project_name == "b"
    again.experiment.end()
