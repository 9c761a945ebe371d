"""``lightning-resume check``: its choice of points and its comparisons (no training), its process
handling (real processes), and the check of small projects written as users write them
(``tests/projects/check/``: each run is real training, killed and relaunched)."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import built_once, job_env, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import RequeueCheckpoint, RunDir, cli
from lightning_resume._scheduler.environment import check_settings, final_path
from lightning_resume.cli import check, check_compare
from lightning_resume.cli.check_compare import Difference

PROJECTS = Path(__file__).resolve().parents[1] / "projects" / "check"
SCRIPT = str(Path(sys.executable).parent / "lightning-resume")


def timeline(epochs: int = 2, per_epoch: int = 6, every: int = 2) -> list[dict[str, Any]]:
    """Rank 0's records of an uninterrupted run: saves every ``every`` steps and at each epoch's end
    (before the next epoch's first batch), a validation at each epoch's end."""
    records: list[dict[str, Any]] = [{"e": "start", "s": 0, "ep": 0}]
    for epoch in range(epochs):
        if epoch:
            records.append({"e": "save", "s": epoch * per_epoch, "ep": epoch, "epoch_end": True})
        for i in range(per_epoch):
            step = epoch * per_epoch + i
            records.append({"e": "batch", "s": step, "ep": epoch, "i": i, "d": f"b{step}"})
            records.append({"e": "step", "s": step + 1, "ep": epoch, "loss": f"l{step}", "w": f"w{step}"})
            if (step + 1) % every == 0 and i != per_epoch - 1:
                records.append({"e": "save", "s": step + 1, "ep": epoch, "epoch_end": False})
        records.append({"e": "val", "s": (epoch + 1) * per_epoch, "ep": epoch})
        records.append({"e": "epoch_end", "s": (epoch + 1) * per_epoch, "ep": epoch})
    records.append({"e": "save", "s": epochs * per_epoch, "ep": epochs - 1, "epoch_end": True})
    return [*records, {"e": "end", "s": epochs * per_epoch, "ep": epochs - 1}]


def test_points_are_chosen_from_the_uninterrupted_runs_timeline() -> None:
    plans = check.choose(timeline(), list(check.POINTS), 2, random.Random(0))
    # Saves at 2, 4, (6: epoch end), 8, 10; a mid-epoch kill resumes from a save of its own epoch.
    assert plans["mid-epoch"] == ["step:9"]
    assert plans["after-epoch-save"] == ["save:6"]
    assert plans["in-validation"] == ["validation:6"]
    assert plans["in-save"] == ["in-save:4"]
    assert plans["after-restart"] == ["step:5", "first-step"]
    assert plans["sigterm"] == ["sigterm:9"]
    random_steps = [int(kill.split(":")[1]) for kill in plans["random"]]
    assert len(random_steps) == 2 and random_steps == sorted(random_steps)


def test_a_point_the_steps_do_not_offer_is_left_out() -> None:
    one_epoch = check.choose(timeline(epochs=1), list(check.POINTS), 0, random.Random(0))
    assert one_epoch["after-epoch-save"] == [] and one_epoch["mid-epoch"] == ["step:5"]


def _attempts(*runs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [list(run) for run in runs]


def test_a_resumed_attempt_replaces_the_steps_it_redoes() -> None:
    whole = timeline()
    killed = whole[: whole.index({"e": "step", "s": 4, "ep": 0, "loss": "l3", "w": "w3"}) + 1]
    resumed = [
        {"e": "start", "s": 2, "ep": 0},
        *[r for r in whole if r["e"] in ("batch", "step") and r["s"] >= 2],
    ]
    assert check_compare.step_difference([whole], [killed, resumed]) is None
    other = [dict(r, d="other") if r["e"] == "batch" and r["s"] == 3 else r for r in resumed]
    assert check_compare.step_difference([whole], [killed, other]) == Difference(
        "batch", "the batch differs from step 3", 3
    )
    skipped = [r for r in resumed if r.get("s") != 5]
    found = check_compare.step_difference([whole], [killed, skipped])
    assert found is not None and (found.field, found.step) == ("position", 4)


def test_logs_differ_when_a_value_is_logged_twice() -> None:
    reference = {"CSVLogger#0": {("loss", 3): ["0.5"], ("epoch", 3): ["0", "0"]}}
    assert check_compare.log_difference(reference, reference) is None
    twice = {"CSVLogger#0": {("loss", 3): ["0.5", "0.5"], ("epoch", 3): ["0", "0"]}}
    assert check_compare.log_difference(reference, twice) == Difference(
        "logs", "CSVLogger 'loss' at step 3: logged 2 times, not 1", 3
    )


def test_states_are_compared_bit_for_bit() -> None:
    state = {"w": torch.tensor([0.0, math.nan]), "opt": [{"lr": math.nan, "step": 3}]}
    assert (
        check_compare.unequal(
            state, {"w": torch.tensor([0.0, math.nan]), "opt": [{"lr": math.nan, "step": 3}]}
        )
        is None
    )
    assert check_compare.unequal(state, {**state, "w": torch.tensor([-0.0, math.nan])}) == "w"
    assert check_compare.unequal(state, {**state, "opt": [{"lr": math.nan, "step": 4}]}) == "opt[0].step"


def test_the_error_line_is_the_last_exception(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(
        "Traceback (most recent call last):\n  File x\n"
        "_pickle.UnpicklingError: Weights only load failed\n\nbye\n"
    )
    assert check.error_line(log) == "_pickle.UnpicklingError: Weights only load failed"


def test_the_settings_a_process_gets_are_read_back() -> None:
    assert check_settings({}) is None
    settings = check_settings({"LIGHTNING_RESUME_CHECK": '{"folder": "/x", "kill": "step:3", "driver": 1}'})
    assert settings is not None and (settings.folder, settings.kill, settings.steps) == ("/x", "step:3", None)
    with pytest.raises(ValueError, match="LIGHTNING_RESUME_CHECK"):
        check_settings({"LIGHTNING_RESUME_CHECK": '{"folder": "/x", "colour": 1}'})


def test_under_the_check_fit_stops_at_its_step_limit_and_records_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "check"
    monkeypatch.setenv("LIGHTNING_RESUME_CHECK", json.dumps({"folder": str(folder), "steps": 5, "every": 2}))
    callbacks = (RunDir(root=tmp_path / "runs"), RequeueCheckpoint(every_n_train_steps=100))
    trainer = tiny_trainer(*callbacks, tmp_path=tmp_path, max_epochs=3)
    trainer.fit(BoringModel())
    assert trainer.global_step == 5  # not 12: stopped cleanly after 5 steps
    (attempt,) = check_compare.read_timeline(folder)[0]
    start, end = attempt[0], attempt[-1]
    assert (start["e"], start["limit"], start["every"], end["e"], end["s"]) == ("start", 5, 2, "end", 5)
    assert Path(start["run_dir"]).is_relative_to(folder / "runs") and not (tmp_path / "runs").exists()
    saves = [(r["s"], r["epoch_end"]) for r in attempt if r["e"] == "save"]
    assert saves == [(2, False), (4, True), (5, True)]  # every 2 steps (the check's), epoch ends, the end
    assert [r["i"] for r in attempt if r["e"] == "batch"] == [0, 1, 2, 3, 0]
    final = torch.load(final_path(folder, 0), weights_only=False)
    assert final["global_step"] == 5
    assert check_compare.unequal(final["state_dict"], BoringModel().state_dict()) is not None  # trained


def _alive_in(folder: Path) -> list[int]:
    """Processes whose working folder lies under ``folder``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).is_relative_to(folder):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_an_attempt_past_its_timeout_is_killed_with_its_whole_group(tmp_path: Path) -> None:
    command = ["sh", "-c", "sleep 300 & sleep 300"]
    runner = check.Runner(check.Options(command, timeout=1), None, tmp_path)
    scenario = runner.run("hang", [])
    attempt = scenario.attempts[0]
    assert attempt.status is None and "no end within 1 s" in attempt.error
    deadline = time.monotonic() + 10
    while _alive_in(tmp_path) and time.monotonic() < deadline:  # killed: reaped by init
        time.sleep(0.1)
    assert _alive_in(tmp_path) == []


def test_a_stopped_check_stops_the_attempt_it_is_running(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    cmd = [SCRIPT, "check", "--workdir", str(tmp_path), "--", "sleep", "300"]
    proc = subprocess.Popen(cmd, env=job_env(), cwd=tmp_path / "project", stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "project"
    deadline = time.monotonic() + 300
    while not [p for p in _alive_in(tmp_path) if p != proc.pid] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in _alive_in(tmp_path) if p != proc.pid], "the attempt never started"
    proc.terminate()  # as a CI job's timeout does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert _alive_in(tmp_path) == [] and list(tmp_path.iterdir()) == [runs]  # its folder removed too


def test_a_run_whose_check_was_killed_stops_at_its_next_step(tmp_path: Path) -> None:
    proc = subprocess.Popen([SCRIPT, "demo", "--workdir", str(tmp_path)], env=job_env(), cwd=tmp_path)
    deadline = time.monotonic() + 600
    while not list(tmp_path.glob("*/uninterrupted-1/timeline.rank-0.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.kill()  # no chance to clean up: the training run notices at its next step
    proc.wait()
    while _alive_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive_in(tmp_path) == []
    (timeline,) = tmp_path.glob("*/uninterrupted-1/timeline.rank-0.jsonl")
    assert "end" not in [r["e"] for r in check_compare.parse(timeline.read_text().splitlines())]


def test_help_lists_every_point() -> None:
    assert ", ".join(check.POINTS) == cli._POINTS


def test_bad_input_is_one_line_with_status_2(tmp_path: Path) -> None:
    for args in (
        ["check", "--points", "mid-epoch,sideways", "--", "true"],
        ["check"],
        ["check", "--", "no-such-cmd"],
        ["check", "--workdir", str(tmp_path / "not-there"), "--", "true"],
    ):
        proc = subprocess.run([SCRIPT, *args], env=job_env(), capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr


# -- the check of small projects (real training, killed and relaunched) -----------------------------


def run_check(folder: Path, project: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """``lightning-resume check --json ARGS`` run from ``project``; its status, report and stderr."""
    cmd = [SCRIPT, "check", "--json", "--keep", "--workdir", str(folder), *args]
    proc = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, cwd=project, timeout=1500)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def checked(tmp_path_factory: pytest.TempPathFactory, name: str, project: Path, *args: str) -> dict[str, Any]:
    """The check's status, report, progress and folder, run once per test run."""

    def build(folder: Path) -> None:
        code, report, err = run_check(folder, project, *args)
        (folder / "result.json").write_text(json.dumps({"code": code, "report": report, "err": err}))

    folder = built_once(tmp_path_factory, name, build)
    return {**json.loads((folder / "result.json").read_text()), "folder": folder}


@pytest.mark.slow
@pytest.mark.timeout(2400)  # many launches of a real training job
def test_a_project_with_plain_loaders_a_logger_and_early_stopping_is_exact(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    found = checked(
        tmp_path_factory, "check-exact", PROJECTS, "--kills", "2", "--", sys.executable, "exact.py"
    )
    report = found["report"]
    assert found["code"] == 0, found
    assert report["summary"] == "exact in 7 of 7 scenarios"
    assert [s["name"] for s in report["scenarios"]] == [*check.POINTS, "random"]
    assert all(s["exact"] for s in report["scenarios"])
    # every kill happened where planned and the relaunches went on until the run finished
    for scenario in report["scenarios"]:
        assert [a["kill"] for a in scenario["attempts"]] == [*scenario["kills"], None]
        assert len(scenario["steps_lost"]) == len(scenario["kills"])
    assert any(v.startswith("exact (checked:") for s in report["scenarios"] for v in s["verdicts"])
    # the user's folder is untouched: the logs of each run went to its own working folder
    assert not (PROJECTS / "tb_logs").exists() and not (PROJECTS / "runs").exists()


@pytest.mark.slow
def test_a_loader_that_cannot_be_positioned_is_not_exact_and_the_batch_is_named(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    found = checked(
        tmp_path_factory,
        "check-unpositioned",
        PROJECTS,
        "--points",
        "mid-epoch",
        "--",
        sys.executable,
        "unpositioned.py",
    )
    assert found["code"] == 1, found
    report = found["report"]
    assert report["summary"].startswith("not exact after a mid-epoch kill: the batch differs from step ")
    assert "StatefulDataLoader" in report["remedy"]
    assert report["scenarios"][0]["differences"][0]["field"] == "batch"
    assert report["scenarios"][0]["verdicts"] == ["differs: batch"]


@pytest.mark.slow
def test_a_project_that_is_not_reproducible_stops_at_the_determinism_step(tmp_path: Path) -> None:
    code, report, err = run_check(tmp_path, PROJECTS, "--", sys.executable, "nondeterministic.py")
    assert code == 1 and report["reproducible"] is False, err
    assert (
        report["summary"] == "not reproducible: two uninterrupted runs differ: the batch differs from step 0"
    )
    assert "seed_everything" in report["remedy"]
    assert "scenarios" not in report and "[1/" not in err  # no interruption was tried


@pytest.mark.slow
@pytest.mark.timeout(1200)  # many launches of a real training job
def test_a_lightning_cli_project_with_a_yaml_config_is_exact(tmp_path: Path) -> None:
    points = "mid-epoch,after-epoch-save"
    code, report, err = run_check(
        tmp_path,
        PROJECTS / "cli",
        "--points",
        points,
        "--",
        sys.executable,
        "main.py",
        "fit",
        "--config",
        "config.yaml",
    )
    assert code == 0, (report, err)
    assert report["summary"] == "exact in 2 of 2 scenarios"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # many launches of a real training job
def test_two_ranks_with_lightnings_own_launcher_are_exact(tmp_path: Path) -> None:
    code, report, err = run_check(
        tmp_path, PROJECTS, "--points", "mid-epoch,sigterm", "--", sys.executable, "ddp.py"
    )
    assert code == 0, (report, err)
    run = tmp_path / next(p.name for p in tmp_path.iterdir()) / "mid-epoch"
    assert sorted(p.name for p in run.glob("timeline.rank-*.jsonl")) == [
        "timeline.rank-0.jsonl",
        "timeline.rank-1.jsonl",
    ]
    assert sorted(p.name for p in run.glob("final.rank-*.pt")) == ["final.rank-0.pt", "final.rank-1.pt"]


@pytest.mark.slow
def test_a_restart_that_fails_is_reported_with_its_error_line_and_leaves_no_process(tmp_path: Path) -> None:
    code, report, err = run_check(
        tmp_path, PROJECTS, "--points", "mid-epoch", "--", sys.executable, "restart_fails.py"
    )
    assert code == 1, err
    scenario = report["scenarios"][0]
    assert [d["field"] for d in scenario["differences"]] == ["restart"]
    assert "FileExistsError: [Errno 17] File exists: 'predictions'" in scenario["differences"][0]["detail"]
    assert [a["status"] for a in scenario["attempts"]] == [-9, 1]
    assert report["summary"].startswith("not exact after a mid-epoch kill: attempt 2: ")
    assert _alive_in(tmp_path) == []
