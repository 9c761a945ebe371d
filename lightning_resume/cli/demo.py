"""``lightning-resume demo``: preempt a small training job and show that it resumes exactly.

Trains :mod:`lightning_resume.cli.demo_job` in subprocesses once uninterrupted, then SIGKILLed at random
steps and relaunched like a SLURM requeue (same ``SLURM_JOB_ID``, incremented ``SLURM_RESTART_COUNT``),
reports where each attempt resumed and checks the final weights are bitwise equal to the baseline's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich import progress
from rich.console import Console

from lightning_resume._scheduler.environment import ENV
from lightning_resume.cli import render
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.resolve import read_index

JOB_MODULE = "lightning_resume.cli.demo_job"
EPOCHS = 3
STEPS_PER_EPOCH = 12  # 96 samples, batch size 8
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
SAVE_EVERY = 2
# Kill after the first save (at step SAVE_EVERY at the latest) and before the last step: a resume to show.
FIRST_KILL_STEP = SAVE_EVERY + 1
LAST_KILL_STEP = TOTAL_STEPS - 1
MAX_PREEMPTIONS = LAST_KILL_STEP - FIRST_KILL_STEP + 1
ATTEMPT_TIMEOUT = 300.0  # seconds; an attempt normally takes a few
# SIGKILL, or (with --trackers) the status PreemptionHandler exits with after a SIGTERM.
KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL, 128 + signal.SIGTERM)
LOG_TAIL_LINES = 25
#: The per-attempt table's columns.
COLUMNS = ("attempt", "restart count", "killed at step", "resumed from step", "steps lost", "wall time (s)")
# Launcher and scheduler variables of the shell the demo runs in must not leak into its jobs.
_STRIPPED_PREFIXES = ("SLURM_", "TORCHELASTIC_", "LIGHTNING_RESUME_")
_STRIPPED_NAMES = frozenset({*ENV.values(), "GROUP_RANK", "LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE"})


class DemoError(Exception):
    """The demo cannot start with these arguments or in this environment (a usage error)."""


class JobFailed(Exception):
    """A job did not end the way the demo expected; carries the job's log for the report."""

    def __init__(self, message: str, log: Path) -> None:
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class Attempt:
    """One launch of the preempted run (``None`` steps: not killed, or the fresh first attempt)."""

    number: int  # 1-based; SLURM_RESTART_COUNT is number - 1
    kill_at: int | None  # the global step it was killed at
    resumed_from: int | None
    saved_step: int | None  # the global step in last.ckpt after the kill
    wall_time: float  # seconds from launch to exit

    @property
    def steps_lost(self) -> int | None:
        """Steps trained after the last save and redone by the next attempt (``None`` if not killed)."""
        return None if self.kill_at is None or self.saved_step is None else self.kill_at - self.saved_step


@dataclass(frozen=True)
class Outcome:
    """What the demo measured and checked."""

    kill_steps: list[int]
    seed: int
    baseline_time: float
    attempts: list[Attempt]
    run_dirs: list[Path]
    weights_equal: bool

    @property
    def same_run_dir(self) -> bool:
        """Whether every source (index, checkpoints, the final attempt) names one run dir."""
        return len({p.resolve() for p in self.run_dirs}) == 1

    @property
    def total_steps_lost(self) -> int:
        """Steps redone over all preemptions."""
        return sum(a.steps_lost or 0 for a in self.attempts)

    @property
    def restart_overhead(self) -> float | None:
        """Mean extra wall time per preemption compared with the baseline (``None`` without preemptions)."""
        extra = sum(a.wall_time for a in self.attempts) - self.baseline_time
        return extra / len(self.kill_steps) if self.kill_steps else None


def choose_kill_steps(preemptions: int, rng: random.Random) -> list[int]:
    """Distinct global steps to kill the run at, in increasing order.

    Raises:
        DemoError: when ``preemptions`` is not between 0 and :data:`MAX_PREEMPTIONS`.
    """
    if not 0 <= preemptions <= MAX_PREEMPTIONS:
        raise DemoError(
            f"--preemptions must be between 0 and {MAX_PREEMPTIONS} (the demo job has {TOTAL_STEPS} steps "
            f"and can be killed at steps {FIRST_KILL_STEP}-{LAST_KILL_STEP}), got {preemptions}."
        )
    return sorted(rng.sample(range(FIRST_KILL_STEP, LAST_KILL_STEP + 1), preemptions))


def child_env(
    base: Mapping[str, str], job_id: str | None, restart_count: int, trackio_dir: Path | None = None
) -> dict[str, str]:
    """The environment of one job: ``base`` without launcher variables, plus a simulated SLURM job.

    Args:
        base: The environment to start from (normally ``os.environ``).
        job_id: ``SLURM_JOB_ID`` to set (``None``: no SLURM variables, as for the baseline).
        restart_count: ``SLURM_RESTART_COUNT``; left unset when 0, as SLURM does on a first attempt.
        trackio_dir: Where trackio writes, kept offline (``None``: no trackio).
    """
    env = {
        name: value
        for name, value in base.items()
        if name not in _STRIPPED_NAMES and not name.startswith(_STRIPPED_PREFIXES)
    }
    env["PYTHONWARNINGS"] = "ignore"
    if job_id is not None:
        # SLURM_JOB_NAME=bash makes Lightning treat the "allocation" as interactive instead of
        # taking over process management.
        env.update({ENV["slurm_job"]: job_id, ENV["slurm_ntasks"]: "1", ENV["slurm_job_name"]: "bash"})
        if restart_count:
            env[ENV["slurm_restart"]] = str(restart_count)
    if trackio_dir is not None:
        env.update({"TRACKIO_DIR": str(trackio_dir), "HF_HUB_OFFLINE": "1"})
    return env


def trackio_summary(trackio_dir: Path) -> str:
    """One line on the demo's trackio data: how many runs, and which steps were logged (and re-logged)."""
    import sqlite3

    db = trackio_dir / "lightning-resume-demo.db"
    if not db.is_file():
        return f"trackio: no data at {db}"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT run_name, step, metrics FROM metrics ORDER BY id").fetchall()
    names = sorted({name for name, _, _ in rows})
    # One row per (step, metric): a value logged twice for a step was trained twice.
    logged = [(step, key) for _, step, metrics in rows for key in json.loads(metrics) if key != "epoch"]
    unique = sorted({step for step, _ in logged})
    continuous = unique == list(range(unique[0], unique[-1] + 1)) if unique else False
    again = len({(s, k) for s, k in logged if logged.count((s, k)) > 1})
    span = f"{unique[0]}..{unique[-1]}" if unique else "none"
    return (
        f"trackio: {len(names)} run(s) {names}; steps {span} {'continuous' if continuous else 'with gaps'}; "
        f"{again} step(s) logged twice"
    )


def job_command(root: Path, out: Path, kill_at: int | None, tracker: bool = False) -> list[str]:
    """The command line of one training job (a plain shuffled DataLoader, positioned exactly on resume)."""
    command = [sys.executable, "-m", JOB_MODULE, "--root", str(root), "--out", str(out)]
    command += ["--epochs", str(EPOCHS), "--every", str(SAVE_EVERY)]
    if tracker:
        command += ["--tracker", "trackio"]
    if kill_at is not None and tracker:
        # A graceful preemption: the tracker flushes (a SIGKILL loses its unwritten rows).
        command += ["--preemption", "--signal-at", str(kill_at - 1)]
    elif kill_at is not None:
        command += ["--kill-at", str(kill_at)]
    return command


def run_job(command: Sequence[str], env: Mapping[str, str], log: Path, expect_kill: bool) -> float:
    """Run one job with its output going to ``log``; return its wall time in seconds.

    Raises:
        JobFailed: when the job was not killed although it should have been, or failed.
    """
    start = time.perf_counter()
    with open(log, "wb") as handle:
        try:
            code = subprocess.run(
                command,
                env=dict(env),
                stdout=handle,
                stderr=subprocess.STDOUT,
                timeout=ATTEMPT_TIMEOUT,
                check=False,
                start_new_session=True,  # a preempted job is killed as a group, like a scheduler does
            ).returncode
        except subprocess.TimeoutExpired:
            raise JobFailed(f"{log.stem} did not finish within {ATTEMPT_TIMEOUT:.0f} s", log) from None
    elapsed = time.perf_counter() - start
    if expect_kill and code not in KILLED:
        raise JobFailed(f"{log.stem} should have been killed but exited with status {code}", log)
    if not expect_kill and code != 0:
        raise JobFailed(f"{log.stem} failed with exit status {code}", log)
    return elapsed


def checkpoint_step(path: Path) -> int:
    """The ``global_step`` stored in a Lightning checkpoint."""
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


def bitwise_equal(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    """Whether two state dicts hold the same tensors, bit for bit (so ``NaN`` equals ``NaN``)."""
    return a.keys() == b.keys() and all(
        x.dtype == b[n].dtype and x.shape == b[n].shape and torch.equal(_as_bytes(x), _as_bytes(b[n]))
        for n, x in a.items()
    )


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    return dict(torch.load(path, map_location="cpu", weights_only=True))


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def _dash(value: object) -> str:
    return "—" if value is None else str(value)


def attempt_rows(attempts: Sequence[Attempt]) -> list[tuple[str, ...]]:
    """The per-attempt table's rows (columns: :data:`COLUMNS`)."""
    return [
        (
            str(attempt.number),
            _dash(attempt.number - 1 or None),
            "finished" if attempt.kill_at is None else str(attempt.kill_at),
            "fresh" if attempt.resumed_from is None else str(attempt.resumed_from),
            _dash(attempt.steps_lost),
            f"{attempt.wall_time:.1f}",
        )
        for attempt in attempts
    ]


def summary_lines(outcome: Outcome) -> list[str]:
    """The summary under the table, as rich markup."""
    steps = ", ".join(map(str, outcome.kill_steps))
    overhead = outcome.restart_overhead
    total = sum(a.wall_time for a in outcome.attempts)
    unique = sorted({str(p.resolve()) for p in outcome.run_dirs})
    lines = [
        f"preemptions: {len(outcome.kill_steps)}"
        + (f" (SIGKILL at steps {steps}; seed {outcome.seed})" if steps else ""),
        f"total steps lost: {outcome.total_steps_lost} of {TOTAL_STEPS}",
        f"wall time: {total:.1f} s over {len(outcome.attempts)} attempt(s), uninterrupted baseline "
        f"{outcome.baseline_time:.1f} s",
        "mean restart overhead: "
        + ("n/a (no preemptions)" if overhead is None else f"{overhead:.1f} s per preemption"),
    ]
    if outcome.same_run_dir:
        lines.append(f"run dir (same for every attempt): {unique[0]}")
    else:
        lines.append(f"[red]run dir differs between attempts:[/red] {', '.join(unique)}")
    verdict = "[bold green]yes[/bold green]" if outcome.weights_equal else "[bold red]no[/bold red]"
    lines.append(f"final weights bitwise equal to uninterrupted run: {verdict}")
    return lines


def _plan(kill_steps: Sequence[int], seed: int, trackers: bool = False) -> str:
    if not kill_steps:
        return "as a simulated SLURM job that is never preempted"
    steps = ", ".join(map(str, kill_steps))
    how = "SIGTERM (PreemptionHandler saves and exits)" if trackers else "SIGKILL"
    return f"with {how} at steps {steps} (seed {seed}), restarting it each time like a SLURM requeue"


def _prepare_workdir(workdir: Path | None) -> tuple[Path, bool]:
    """The directory to work in and whether the demo created it as a temporary directory."""
    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="lightning-resume-demo-")), True
    workdir = workdir.expanduser().resolve()
    if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise DemoError(f"--workdir {str(workdir)!r} must be an empty or missing directory.")
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir, False


class _Display(progress.Progress):
    """A transient progress bar over the demo's launches, with a line printed above it per finished launch."""

    def __init__(self, console: Console, launches: int) -> None:
        columns = [progress.SpinnerColumn(), progress.TextColumn("{task.description}"), progress.BarColumn()]
        columns += [progress.MofNCompleteColumn(), progress.TimeElapsedColumn()]
        super().__init__(*columns, console=console, transient=True)
        self._task = self.add_task("starting", total=launches)

    def show(self, description: str) -> None:
        self.update(self._task, description=description)

    def done(self, line: str) -> None:
        """Prints what just finished and advances the bar."""
        self.console.print(f"[green]✓[/green] {line}", highlight=False)
        self.advance(self._task)


def _saved_run_dir_and_step(root: Path, job_id: str, log: Path) -> tuple[Path, int]:
    """After a kill: the run dir the session index records, and the step of its ``last.ckpt``."""
    run_dir = read_index(root, job_id)
    if run_dir is None:
        raise JobFailed(f"the job recorded no run dir for session {job_id!r} under {root}", log)
    last = layout.last_checkpoint(run_dir)
    if not last.is_file():
        raise JobFailed(f"no checkpoint at {last} after the kill", log)
    return run_dir, checkpoint_step(last)


def _describe(attempt: Attempt, launches: int) -> str:
    start = "fresh" if attempt.resumed_from is None else f"from step {attempt.resumed_from}"
    if attempt.kill_at is None:
        end = f"completed {TOTAL_STEPS - (attempt.resumed_from or 0)} steps"
    else:
        end = f"killed at step {attempt.kill_at}, last.ckpt at step {attempt.saved_step}"
    return f"attempt {attempt.number}/{launches} ({start}): {end}, {attempt.wall_time:.1f} s"


def _run(
    workdir: Path, kill_steps: list[int], seed: int, console: Console, trackers: bool = False
) -> Outcome:
    """Run the baseline and the preempted run; measure and check them."""
    logs = workdir / "logs"
    logs.mkdir()
    root = workdir / "preempted"
    job_id = str(random.SystemRandom().randrange(100_000, 1_000_000))
    launches = len(kill_steps) + 1
    attempts: list[Attempt] = []
    run_dirs: list[Path] = []
    baseline_out, out = workdir / "baseline.pt", workdir / "preempted.pt"
    display = _Display(console, launches + 1)
    with display:
        display.show(f"baseline: training {TOTAL_STEPS} steps without interruption")
        command = job_command(workdir / "baseline", baseline_out, None, trackers)
        env = child_env(os.environ, None, 0, workdir / "trackio-baseline" if trackers else None)
        baseline_time = run_job(command, env, logs / "baseline.log", expect_kill=False)
        display.done(f"baseline: {TOTAL_STEPS} steps without interruption, {baseline_time:.1f} s")

        resumed_from: int | None = None
        for number, kill_at in enumerate([*kill_steps, None], start=1):
            start = "fresh" if resumed_from is None else f"from step {resumed_from}"
            plan = "training to the end" if kill_at is None else f"training, to be killed at step {kill_at}"
            display.show(f"attempt {number}/{launches} ({start}): {plan}")
            log = logs / f"attempt-{number}.log"
            env = child_env(os.environ, job_id, number - 1, workdir / "trackio" if trackers else None)
            command = job_command(root, out, kill_at, trackers)
            wall = run_job(command, env, log, expect_kill=kill_at is not None)
            saved_step = None
            if kill_at is not None:
                run_dir, saved_step = _saved_run_dir_and_step(root, job_id, log)
                run_dirs.append(run_dir)
            attempt = Attempt(number, kill_at, resumed_from, saved_step, wall)
            attempts.append(attempt)
            display.done(_describe(attempt, launches))
            resumed_from = saved_step

    final = json.loads(out.with_name(out.name + ".json").read_text())
    run_dirs.append(Path(final["run_dir"]))
    run_dirs.extend(layout.run_dirs(root))
    weights_equal = bitwise_equal(_load_weights(baseline_out), _load_weights(out))
    return Outcome(kill_steps, seed, baseline_time, attempts, run_dirs, weights_equal)


def run_demo(
    preemptions: int = 3,
    seed: int | None = None,
    workdir: Path | None = None,
    keep: bool = False,
    console: Console | None = None,
    trackers: bool = False,
) -> int:
    """Preempt the demo job ``preemptions`` times and compare its final weights with an uninterrupted run.

    Args:
        preemptions: How many times the run is SIGKILLed before it may finish.
        seed: Seed for choosing the kill steps (``None``: a random seed, printed for reuse).
        workdir: Where runs, weights and job logs go; must be empty or missing, and is never deleted.
            ``None``: a temporary directory, deleted at the end unless ``keep`` or a job failed.
        keep: Keep the temporary directory.
        console: Where to print (default: standard output).
        trackers: Also log to trackio (offline, in the work dir) through ``TrackioResume`` and show that
            every attempt continued the same trackio run.

    Returns:
        0 when the final weights are bitwise equal to the uninterrupted run's and every attempt used
        the same run dir, 1 otherwise (also when a job failed).

    Raises:
        DemoError: for arguments out of range, a non-empty ``workdir``, or ``trackers`` without trackio.
    """
    console = console or Console()
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    kill_steps = choose_kill_steps(preemptions, random.Random(seed))
    if trackers and importlib.util.find_spec("trackio") is None:
        raise DemoError("--trackers needs trackio: pip install 'lightning-resume[trackio]'")
    workdir, temporary = _prepare_workdir(workdir)
    console.print(
        f"Training a {TOTAL_STEPS}-step job uninterrupted, then again {_plan(kill_steps, seed, trackers)}."
    )
    keep_dir = keep or not temporary
    try:
        outcome = _run(workdir, kill_steps, seed, console, trackers)
    except JobFailed as e:
        err = Console(stderr=True)
        err.print(f"[red]error:[/red] {e}; last lines of {e.log}:", highlight=False, soft_wrap=True)
        err.print(_tail(e.log, LOG_TAIL_LINES), markup=False, highlight=False)
        err.print(f"work dir kept: {workdir}", highlight=False, soft_wrap=True)
        return 1
    except BaseException:
        if not keep_dir:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    console.print()
    render.table(
        "Preempted run, attempt by attempt",
        COLUMNS,
        attempt_rows(outcome.attempts),
        caption="restart count: the SLURM_RESTART_COUNT the attempt was launched with",
        justify="right",
        console=console,
    )
    for line in summary_lines(outcome):
        console.print(line, highlight=False, soft_wrap=True)
    if trackers:
        console.print(trackio_summary(workdir / "trackio"), highlight=False, soft_wrap=True)
    if keep_dir:
        console.print(f"work dir kept: {workdir}", highlight=False, soft_wrap=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        console.print("work dir removed (--keep keeps it)", highlight=False)
    return 0 if outcome.weights_equal and outcome.same_run_dir else 1
