"""``ProgressWatchdog`` on real processes (gloo on CPU): hung ranks exit with their stacks and the run
resumes exactly; a job that keeps failing stops with its own status; a slow, healthy one is left alone.

The faults come from ``tests/jobs/watchdog_job.py``. Timeouts are short (a few seconds), given as
arguments, so a hang is caught quickly; ``scontrol`` is a stand-in that logs its calls where a test
checks the requeue (``tests/preemption/test_requeue.py``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from _scontrol import fake_scontrol
from conftest import job_env, same_weights, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import (
    CrashLoopStopped,
    MissingCallbackError,
    ProgressWatchdog,
    RequeueCheckpoint,
    RunDir,
    WatchdogTimeouts,
)
from lightning_resume.failure_classes import FailureClass
from lightning_resume.run_dir import attempts, hangs, layout
from lightning_resume.run_dir.status import read_status
from lightning_resume.watchdog.timeouts import read_slowest

JOB = "jobs.watchdog_job"
#: The uninterrupted job and every faulty one: 2 epochs of 6 steps on 2 ranks, last.ckpt every 2 steps.
DDP = ("--devices", "2", "--epochs", "2", "--every", "2")
#: Hangs caught after 4 s without progress; the start-up has its own, generous, timeout.
FAST = ("--min-timeout", "4", "--first-step-timeout", "120")


def run(
    root: Path, out: Path, *args: str, prefix: tuple[str, ...] = (), timeout: float = 300, **env: Any
) -> subprocess.CompletedProcess[str]:
    """``python -m jobs.watchdog_job`` (or under ``prefix``, e.g. torchrun) once, in a session of its own."""
    command = [*prefix] if prefix else [sys.executable, "-m"]
    command += [JOB, "--root", str(root), "--out", str(out), *args]
    return subprocess.run(
        command,
        env=job_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


def only_run_dir(root: Path) -> Path:
    (run_dir,) = layout.run_dirs(root)
    return run_dir


def first_steps(text: str) -> set[int]:
    return {int(step) for step in re.findall(r"FIRST_STEP rank=\d step=(\d+)", text)}


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lightning_resume", *map(str, args)],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final weights of the uninterrupted 2-rank job."""
    folder = tmp_path_factory.mktemp("watchdog-reference")
    proc = run(folder / "runs", folder / "ref.pt", *DDP)
    assert proc.returncode == 0, output(proc)
    return folder / "ref.pt"


@pytest.mark.slow
def test_torchrun_restarts_the_group_when_a_rank_hangs_and_the_run_ends_exact(
    tmp_path: Path, reference: Path
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    proc = run(
        root,
        out,
        *DDP,
        *FAST,
        "--hang",
        "step",
        "--hang-at",
        "5",
        "--hang-rank",
        "1",
        prefix=(*torchrun, "--max-restarts", "1", "-m"),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
    )
    text = output(proc)
    assert proc.returncode == 0, text
    run_dir = only_run_dir(root)  # one run dir for both attempts
    # Rank 1 blocked in its step; rank 0 waited for it in the step's all-reduce: each one's watchdog fired.
    notes = {n.rank: n for n in hangs.read_notes(run_dir)}
    assert sorted(notes) == [0, 1], text
    for rank, note in notes.items():
        assert (note.attempt, note.section, note.step) == (1, "step", 5)
        assert 4.0 <= note.seconds < 4.0 + 10, note  # its own timeout, not gloo's 30 minutes
        assert f"ProgressWatchdog: rank {rank} hung in training step at step 5" in text
        assert str(run_dir / note.stacks) in text  # the log line names the stacks file
    assert "block_forever" in (run_dir / notes[1].stacks).read_text()
    assert "backward" in (run_dir / notes[0].stacks).read_text()  # waiting in DDP's gradient all-reduce
    assert "requeue: none: torchrun restarts the workers (1 restart(s) left)" in text
    # torchrun restarted the group, which resumed from the last durable checkpoint (step 4), exactly.
    assert first_steps(text) == {0, 4}, text
    assert same_weights(out, reference)
    first, second = attempts.read(run_dir).attempts
    assert first.end is not None and first.end.cause is attempts.Cause.HUNG and first.end.step == 5
    assert second.resumed_from == 4 and second.end is not None and second.end.cause is attempts.Cause.FINISHED
    shown = json.loads(cli("inspect", run_dir, "--json").stdout)["attempts"]
    assert [(h["attempt"], h["section"], h["step"]) for h in shown["hangs"]] == [(1, "training step", 5)]
    assert shown["crash_loop"]["attempts_without_progress"] == 0


@pytest.mark.slow
def test_lightning_launcher_hang_requeues_once_and_the_relaunch_ends_exact(
    tmp_path: Path, reference: Path
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    slurm, log = fake_scontrol(tmp_path)
    hang = ("--hang", "step", "--hang-at", "9", "--hang-rank", "1")
    first = run(root, out, *DDP, *FAST, *hang, SLURM_JOB_ID=77, **slurm)
    assert first.returncode == ProgressWatchdog.HANG_EXIT_CODE, output(first)
    run_dir = only_run_dir(root)
    assert sorted(n.rank for n in hangs.read_notes(run_dir)) == [0, 1]
    status = read_status(run_dir)
    assert status["status"] == "hung" and status["step"] == 9 and status["hang"]["section"] == "step"
    assert log.read_text().splitlines() == ["-o show job 77", "requeue 77"]  # once, by rank 0
    second = run(root, out, *DDP, *FAST, *hang, SLURM_JOB_ID=77, SLURM_RESTART_COUNT=1, **slurm)
    assert second.returncode == 0, output(second)
    assert first_steps(output(second)) == {8}
    assert same_weights(out, reference)
    assert log.read_text().splitlines() == ["-o show job 77", "requeue 77"]


@pytest.mark.parametrize(
    ("fault", "section"),
    [
        (("--hang", "save", "--hang-at", "4", "--min-timeout", "3", "--step-timeout", "600"), "save"),
        (("--hang", "step", "--hang-at", "0", "--first-step-timeout", "4"), "startup"),
    ],
    ids=["save", "first-step"],
)
def test_a_hang_is_caught_by_its_own_sections_timeout(
    tmp_path: Path, fault: tuple[str, ...], section: str
) -> None:
    proc = run(tmp_path / "runs", tmp_path / "out.pt", *fault)
    assert proc.returncode == ProgressWatchdog.HANG_EXIT_CODE, output(proc)
    run_dir = only_run_dir(tmp_path / "runs")
    (note,) = hangs.read_notes(run_dir)
    assert note.section == section and note.step == (4 if section == "save" else 0)
    assert note.seconds < 60  # caught by this section's timeout (the step's is 600 s, or learned)
    assert read_status(run_dir)["status"] == "hung"


@pytest.mark.slow
def test_a_job_that_fails_at_the_same_step_stops_after_n_attempts_until_reset(tmp_path: Path) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    slurm, log = fake_scontrol(tmp_path)
    fail = ("--raise-at", "3", "--max-attempts", "2")
    # The first attempt saves steps 1 and 2 before it fails; the next two only get back to step 3.
    for attempt in range(3):
        restart = {"SLURM_RESTART_COUNT": attempt} if attempt else {}
        failed = run(root, out, *fail, SLURM_JOB_ID=88, **slurm, **restart)
        assert "boom at step 3" in failed.stderr, output(failed)
        assert failed.returncode == FailureClass.ERROR.exit_code  # an error after the first step: 70, not 1
    stopped = run(root, out, *fail, SLURM_JOB_ID=88, SLURM_RESTART_COUNT=3, **slurm)
    assert stopped.returncode == ProgressWatchdog.CRASH_LOOP_EXIT_CODE, output(stopped)
    assert "FIRST_STEP" not in stopped.stdout  # stopped before training
    (line,) = [line for line in stopped.stderr.splitlines() if "ProgressWatchdog: not training" in line]
    run_dir = only_run_dir(root)
    assert "the last 2 attempts" in line and "started from step 2 and reached step(s) 3, 3" in line
    assert "RuntimeError: boom at step 3" in line and f"reset-crash-loop {run_dir}" in line
    assert not log.exists()  # no requeue
    assert read_status(run_dir)["status"] == "crash-loop"
    shown = json.loads(cli("inspect", run_dir, "--json").stdout)["attempts"]["crash_loop"]
    assert shown["attempts_without_progress"] == 3 and shown["limit"] == 2
    reset = cli("reset-crash-loop", run_dir)
    assert reset.returncode == 0, reset.stderr
    assert "crash-loop count reset (it was 3 attempt(s)" in reset.stdout
    fixed = run(root, out, "--max-attempts", "2", SLURM_JOB_ID=88, SLURM_RESTART_COUNT=4, **slurm)
    assert fixed.returncode == 0, output(fixed)
    assert first_steps(fixed.stdout) == {2}


def test_a_slow_but_healthy_job_is_never_killed(tmp_path: Path) -> None:
    # Each step sleeps 1.3 x longer than the one before (0.1 s to 1.8 s over 2 epochs of 6), and a
    # validation batch takes 3 s, more than a step's learned timeout after the first epoch (1.9 s).
    # A fixed 1 s timeout would end the steps; one timeout for every section, the validation.
    args = ("--step-sleep", "0.1", "--step-growth", "1.3", "--samples", "48", "--val", "--val-batches", "1")
    slow = (*args, "--val-sleep", "3", "--min-timeout", "1", "--first-step-timeout", "120")
    proc = run(tmp_path / "runs", tmp_path / "out.pt", *slow)
    assert proc.returncode == 0, output(proc)
    run_dir = only_run_dir(tmp_path / "runs")
    assert not layout.hangs_dir(run_dir).exists()
    slowest = read_slowest(run_dir)
    assert slowest["step"] > 1.5 and slowest["validation"] >= 3.0


# -- in one process ---------------------------------------------------------------------------------


def test_every_section_is_timed_and_kept_for_the_next_attempt(tmp_path: Path) -> None:
    def fit(steps: int) -> RunDir:
        run_dir = RunDir(root=tmp_path / "root", key="sections")
        watchdog = ProgressWatchdog()
        trainer = tiny_trainer(
            run_dir,
            RequeueCheckpoint(every_n_train_steps=2),
            watchdog,
            tmp_path=tmp_path,
            max_steps=steps,
            max_epochs=3,
            limit_val_batches=1,
        )
        trainer.fit(BoringModel())
        assert not watchdog._dog.alive  # nothing left running after fit
        return run_dir

    first = fit(6)
    seen = read_slowest(first.path)
    assert {s.value for s in seen} == {"startup", "step", "validation", "epoch_end", "save", "teardown"}
    history = attempts.read(first.path)
    assert history.attempts[0].saves.count >= 3
    second = fit(8)  # a restart: it loads last.ckpt
    assert "load" in {s.value for s in read_slowest(second.path)}
    assert [a.resumed_from for a in attempts.read(second.path).attempts] == [None, 6]


def test_without_run_dir_setup_says_what_to_add(tmp_path: Path) -> None:
    watchdog = ProgressWatchdog()
    with pytest.raises(MissingCallbackError, match="ProgressWatchdog needs a RunDir"):
        tiny_trainer(watchdog, tmp_path=tmp_path).fit(BoringModel())


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"timeouts": {"step": 5}}, TypeError),
        ({"max_attempts_without_progress": -1}, ValueError),
        ({"max_attempts_without_progress": True}, TypeError),
        ({"requeue": "yes"}, TypeError),
    ],
)
def test_bad_arguments_are_refused_naming_the_value(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=re.escape(repr(next(iter(kwargs.values()))))):
        ProgressWatchdog(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"step": 0}, ValueError),
        ({"save": "5"}, TypeError),
        ({"multiple": 0.5}, ValueError),
        ({"minimum": -1}, ValueError),
    ],
)
def test_bad_timeouts_are_refused_naming_the_value(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=re.escape(repr(next(iter(kwargs.values()))))):
        WatchdogTimeouts(**kwargs)


def test_lightning_cli_yaml_builds_and_runs_it(tmp_path: Path) -> None:
    from lightning.pytorch.cli import LightningCLI

    config = {
        "trainer": {
            "max_steps": 2,
            "limit_val_batches": 0,
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(tmp_path),
            "callbacks": [
                {"class_path": "lightning_resume.RunDir", "init_args": {"root": str(tmp_path / "runs")}},
                {
                    "class_path": "lightning_resume.ProgressWatchdog",
                    "init_args": {
                        "timeouts": {"step": 30.5, "minimum": 5},
                        "max_attempts_without_progress": 2,
                    },
                },
            ],
        }
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningCLI(
        BoringModel, args=["fit", "--config", str(path)], save_config_kwargs={"overwrite": True}
    )
    (watchdog,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, ProgressWatchdog)]
    assert watchdog.max_attempts_without_progress == 2 and watchdog.timeouts.minimum == 5.0
    saved = json.loads((only_run_dir(tmp_path / "runs") / layout.WATCHDOG).read_text())
    assert saved["fixed"] == {"step": 30.5} and saved["timeouts"]["step"] == 30.5


def test_hydra_instantiates_it() -> None:
    from hydra.utils import instantiate

    watchdog = instantiate(
        {
            "_target_": "lightning_resume.ProgressWatchdog",
            "timeouts": {"_target_": "lightning_resume.WatchdogTimeouts", "step": 45},
            "requeue": False,
        }
    )
    try:
        assert isinstance(watchdog, ProgressWatchdog) and not watchdog.requeue
        assert watchdog.timeouts.step == 45.0
    finally:
        watchdog._dog.stop()


def test_crash_loop_stopped_is_a_system_exit_with_its_own_status() -> None:
    stop = CrashLoopStopped("three in a row", ProgressWatchdog.CRASH_LOOP_EXIT_CODE, attempts=3)
    assert isinstance(stop, SystemExit) and stop.code == 93 and str(stop) == "three in a row"
