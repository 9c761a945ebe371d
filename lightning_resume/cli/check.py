"""``lightning-resume check -- COMMAND``: runs the command twice uninterrupted, then killed at each point and
relaunched, and compares; the library reads its part from ``$LIGHTNING_RESUME_CHECK`` (``_check_hooks``)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from lightning_resume._scheduler.environment import ENV, timeline_path
from lightning_resume.cli import check_compare as compare
from lightning_resume.cli import render

#: The points, in the order they run, and how the summary names them.
POINTS = {
    "mid-epoch": "a mid-epoch kill",
    "after-epoch-save": "a kill right after an epoch-end save",
    "in-validation": "a kill inside validation",
    "in-save": "a kill inside a save",
    "after-restart": "a kill in the first step after a restart",
    "sigterm": "a SIGTERM",
}
KEY = "lightning-resume-check"
#: Folders runs write into, left out of a run's working folder (each run starts without them).
OUTPUTS = frozenset(
    {"lightning_logs", "logs", "runs", "outputs", "multirun", "wandb", "mlruns", "swanlog", "checkpoints"}
)
#: Trackers never reach the network, and keep their files in the run's folder.
OFFLINE = dict(WANDB_MODE="offline", WANDB_SILENT="true", SWANLAB_MODE="offline", NEPTUNE_MODE="offline")
_STRIPPED_PREFIXES = ("SLURM_", "TORCHELASTIC_", "LIGHTNING_RESUME_", "PET_")
_STRIPPED = frozenset({*ENV.values(), "GROUP_RANK", "LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE"})
_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b")
_KILLS = {
    "step": "SIGKILL at step {}",
    "save": "SIGKILL after save {}",
    "in-save": "SIGKILL in save {}",
    "validation": "SIGKILL in validation {}",
    "first-step": "SIGKILL at its first step",
    "sigterm": "SIGTERM at step {}",
}


class CheckError(Exception):
    """The check cannot start with these options (a usage error, said in one line)."""


class RunFailed(Exception):
    """An uninterrupted run failed, or cannot be checked: the check has nothing to compare with."""


@dataclass(frozen=True)
class Options:
    """What ``lightning-resume check`` was asked (see ``--help``)."""

    command: list[str]
    steps: int | None = None
    every: int | None = None
    points: list[str] = field(default_factory=lambda: list(POINTS))
    kills: int = 0
    seed: int | None = None
    timeout: float | None = None
    workdir: Path | None = None
    keep: bool = False
    json: bool = False


@dataclass
class Attempt:
    """One launch of the command: its kill point, exit status (``None``: timed out), and rank 0's records."""

    kill: str | None
    status: int | None
    seconds: float
    records: compare.Records
    error: str = ""

    @property
    def killed(self) -> bool:
        return any(r["e"] == "kill" for r in self.records)

    @property
    def finished(self) -> bool:
        return self.status == 0 and any(r["e"] == "end" for r in self.records)

    @property
    def last_step(self) -> int | None:
        return max((r["s"] for r in self.records), default=None)

    @property
    def resumed_from(self) -> int | None:
        return self.records[0]["s"] if self.records and self.records[0]["e"] == "start" else None


@dataclass
class Scenario:
    """A run of the command: killed at ``kills`` (one per attempt), relaunched until it finished."""

    name: str
    kills: list[str]
    attempts: list[Attempt] = field(default_factory=list)
    differences: list[compare.Difference] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.differences

    @property
    def steps_lost(self) -> list[int]:
        """Per interruption: the steps trained after the save the next attempt resumed from."""
        pairs = zip(self.attempts, self.attempts[1:], strict=False)
        return [(a.last_step or 0) - (b.resumed_from or 0) for a, b in pairs if a.killed and b.records]

    def to_dict(self) -> dict[str, Any]:
        tried = [{**asdict(a), "records": len(a.records), "from": a.resumed_from} for a in self.attempts]
        found = {"name": self.name, "kills": self.kills, "exact": self.exact, "verdicts": self.verdicts}
        found["differences"] = [asdict(d) for d in self.differences]
        return {**found, "steps_lost": self.steps_lost, "attempts": tried}


def choose(records: compare.Records, points: Sequence[str], kills: int, rng: random.Random) -> dict[str, Any]:
    """The kill points of each scenario, from the uninterrupted run's timeline (rank 0's records)."""
    final = max((r["s"] for r in records if r["e"] == "end"), default=0)
    saves = [(r["s"], bool(r.get("epoch_end"))) for r in records if r["e"] == "save" and r["s"] < final]
    first = min((s for s, _ in saves), default=final)
    ends = {r["s"] for r in records if r["e"] == "epoch_end"}
    # Steps after the first save, not saved themselves, not an epoch's last: a kill there loses steps;
    # "inside" ones resume from a save in the same epoch.
    steps = {r["s"] for r in records if r["e"] == "step" and first < r["s"] < final}
    free = sorted(steps - {s for s, _ in saves} - ends)
    inside = [f for f in free if not ends & set(range(max(s for s, _ in saves if s < f), f))]
    vals = [r["s"] for r in records if r["e"] == "val" and r["s"] < final]
    plans = {
        "mid-epoch": [f"step:{inside[len(inside) // 2]}"] if inside else [],
        "after-epoch-save": [f"save:{s}" for s, end in saves if end][:1],
        "in-validation": [f"validation:{v}" for v in sorted(vals, key=lambda v: v <= first)][:1],
        "in-save": [f"in-save:{s}" for s, end in saves if s > first and not end][:1],
        "after-restart": [f"step:{inside[len(inside) // 3]}", "first-step"] if inside else [],
        "sigterm": [f"sigterm:{free[2 * len(free) // 3]}"] if free else [],
    }
    chosen = {name: plans[name] for name in points}
    if kills:
        chosen["random"] = [f"step:{s}" for s in sorted(rng.sample(free, min(kills, len(free))))]
    return chosen


def describe(kill: str) -> str:
    kind, _, step = kill.partition(":")
    return _KILLS[kind].format(step)


def error_line(log: Path) -> str:
    """The error a failed attempt ended with: its last exception line, else its last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    found = [line for line in lines if _ERROR.match(line)]
    return (found or lines or ["(no output)"])[-1][:400]


class Runner:
    """Launches the command in run folders under ``scratch``, from ``project``."""

    def __init__(self, options: Options, project: Path | None, scratch: Path) -> None:
        self.options, self.project, self.scratch = options, project, scratch
        self.timeout = options.timeout or 3600.0

    def env(self, folder: Path, kill: str | None) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if k not in _STRIPPED and not k.startswith(_STRIPPED_PREFIXES)
        }
        settings = {"folder": str(folder), "steps": self.options.steps, "every": self.options.every}
        env.update(OFFLINE, HF_HUB_OFFLINE="1", TRACKIO_DIR=str(folder / "trackio"), PYTHONUNBUFFERED="1")
        env["MLFLOW_TRACKING_URI"] = (folder / "mlruns").as_uri()
        env[ENV["key"]] = KEY
        env[ENV["check"]] = json.dumps({**settings, "kill": kill, "driver": os.getpid()})
        return env

    def _working_folder(self, folder: Path) -> Path:
        """``folder/work``, linking each of the project's files and folders but :data:`OUTPUTS`."""
        work = folder / "work"
        work.mkdir(parents=True)
        for entry in self.project.iterdir() if self.project else ():
            if entry.name not in OUTPUTS and not self.scratch.resolve().is_relative_to(entry.resolve()):
                (work / entry.name).symlink_to(entry)
        return work

    def launch(self, folder: Path, work: Path, kill: str | None, number: int) -> Attempt:
        timeline = timeline_path(folder, 0)
        seen = len(timeline.read_text().splitlines()) if timeline.exists() else 0
        log = folder / f"attempt-{number}.log"
        start = time.monotonic()
        with open(log, "wb") as out:
            try:
                # a session of its own: killed as a group, as a scheduler does
                proc = subprocess.Popen(
                    self.options.command, cwd=work, env=self.env(folder, kill), stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            except OSError as e:
                raise CheckError(f"cannot run {self.options.command[0]!r}: {e.strerror or e}") from None
            try:
                status: int | None = proc.wait(self.timeout)
            except subprocess.TimeoutExpired:
                status = None
            finally:  # what is left of it: data loader workers, other ranks
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        records = compare.parse(timeline.read_text().splitlines()[seen:] if timeline.exists() else [])
        attempt = Attempt(kill, status, time.monotonic() - start, records)
        if not attempt.finished and not attempt.killed:
            if status is None:
                attempt.error = f"no end within {self.timeout:.0f} s: killed (--timeout)"
            elif status < 0:
                attempt.error = f"killed by {signal.Signals(-status).name}"
            else:
                attempt.error = error_line(log)
        return attempt

    def run(self, name: str, kills: list[str]) -> Scenario:
        """Launch until the run finishes, fails, or has had one more attempt than kills."""
        folder = self.scratch / name
        work = self._working_folder(folder)
        scenario = Scenario(name, kills)
        for number in range(len(kills) + 2):
            kill = kills[number] if number < len(kills) else None
            attempt = self.launch(folder, work, kill, number + 1)
            scenario.attempts.append(attempt)
            if attempt.finished or not attempt.killed:
                break
        return scenario


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # a CI job's timeout (SIGTERM): the attempt running is killed on the way out


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _summary(scenarios: list[Scenario]) -> tuple[str, str]:
    """The one-line verdict and its remedy."""
    failed = [s for s in scenarios if not s.exact]
    if not scenarios:
        return "no scenario ran: the steps offer none of the points (more --steps, or other --points)", ""
    if not failed:
        return f"exact in {len(scenarios)} of {len(scenarios)} scenarios", ""
    first, difference = failed[0], failed[0].differences[0]
    what = POINTS.get(first.name, f"{len(first.kills)} random kills")
    more = f" (and {len(failed) - 1} more of {len(scenarios)} scenarios)" if len(failed) > 1 else ""
    remedy = compare.REMEDY.get(difference.field, "")
    return f"not exact after {what}: {difference.detail}{more}", f"{remedy} (see {compare.TROUBLESHOOTING})"


def _row(scenario: Scenario) -> tuple[str, ...]:
    first = scenario.differences[0] if scenario.differences else None
    fields = ", ".join(dict.fromkeys(d.field for d in scenario.differences))
    return (
        scenario.name,
        "; ".join(describe(k) for k in scenario.kills),
        "exact" if first is None else f"differs: {fields}",
        "" if first is None else first.detail if first.step is None else f"step {first.step}: {first.field}",
        "; ".join(v.split(" (")[0] for v in scenario.verdicts) or "-",
        ", ".join(map(str, scenario.steps_lost)) or "-",
    )


def _judge(scenario: Scenario, reference: Path, folder: Path) -> None:
    """Fill in what differs from the uninterrupted run."""
    last, number = scenario.attempts[-1], len(scenario.attempts)
    if not last.finished:
        scenario.differences.append(compare.Difference("restart", f"attempt {number}: {last.error}"))
    else:
        scenario.differences += compare.differences(reference, folder)
    if any(a.killed and "sigterm" in str(a.kill) and a.status == 0 for a in scenario.attempts):
        scenario.differences.append(compare.Difference("exit status", "exit status 0 after SIGTERM"))
    scenario.verdicts = compare.verdicts(folder)


def _reference(runner: Runner, number: int) -> Scenario:
    run = runner.run(f"uninterrupted-{number}", [])
    attempt = run.attempts[0]
    if not attempt.finished:
        if attempt.status == 0 and not attempt.records:
            raise RunFailed(
                "the command finished but RequeueCheckpoint never ran in it: the check needs RunDir() and "
                "RequeueCheckpoint() among the Trainer's callbacks (docs/src/requeue_checkpoint.md)"
            )
        raise RunFailed(f"the uninterrupted run failed: {attempt.error}")
    return run


def check(options: Options, project: Path | None) -> int:
    """Check ``options.command`` from ``project`` (``None``: a folder of its own): 0 if all exact, else 1."""
    unknown = sorted(set(options.points) - set(POINTS))
    if unknown:
        raise CheckError(f"unknown --points {', '.join(unknown)} (choose from {', '.join(POINTS)})")
    if not options.command:
        raise CheckError("no command to check: give it after --, e.g. -- python train.py")
    if shutil.which(options.command[0]) is None:
        raise CheckError(f"{options.command[0]!r} is not a command here (not found on PATH)")
    if options.workdir is not None and not options.workdir.is_dir():
        raise CheckError(f"--workdir {options.workdir} is not a directory: create it, or leave --workdir out")
    scratch = Path(tempfile.mkdtemp(prefix="lightning-resume-check-", dir=options.workdir))
    started = time.monotonic()
    _progress(
        f"checking `{' '.join(options.command)}` in {scratch}; trackers offline "
        f"({', '.join(f'{k}={v}' for k, v in OFFLINE.items())}; trackio and MLflow in the check's folder)"
    )
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return _check(options, Runner(options, project, scratch), scratch, started)
    except RunFailed as e:
        return _finish(options, {"exact": False, "error": str(e), "folder": str(scratch)}, [], f"error: {e}")
    finally:
        signal.signal(signal.SIGTERM, previous)
        if options.keep:
            _progress(f"kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
            _progress("its folder is removed (--keep keeps the runs, their output and timelines)")


def _check(options: Options, runner: Runner, scratch: Path, started: float) -> int:
    first = _reference(runner, 1)
    reference, records = scratch / first.name, first.attempts[0].records
    start = records[0]
    _progress(
        f"[uninterrupted 1] {start['limit']} steps at most, saves every {start['every']}: ended at step "
        f"{first.attempts[0].last_step} in {first.attempts[0].seconds:.1f} s"
    )
    if options.timeout is None:
        runner.timeout = max(120.0, 5 * first.attempts[0].seconds)
    second = _reference(runner, 2)
    found = compare.differences(reference, scratch / second.name)
    report: dict[str, Any] = {"command": options.command, "folder": str(scratch), "steps": start["limit"]}
    if found:
        line = f"not reproducible: two uninterrupted runs differ: {found[0].detail}"
        _progress(f"[uninterrupted 2] {line}")
        report.update(exact=False, reproducible=False, summary=line, remedy=compare.NOT_REPRODUCIBLE)
        report["differences"] = [asdict(d) for d in found]
        return _finish(options, report, [], f"{line}\n{compare.NOT_REPRODUCIBLE}")
    _progress("[uninterrupted 2] reproducible: the same batches, losses and weights at every step")
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**31)
    plans = choose(records, options.points, options.kills, random.Random(seed))
    scenarios = []
    for n, (name, kills) in enumerate(plans.items(), start=1):
        if not kills:
            _progress(f"[{n}/{len(plans)}] {name}: skipped, {start['limit']} steps offer no such point")
            continue
        scenario = runner.run(name, kills)
        _judge(scenario, reference, scratch / name)
        scenarios.append(scenario)
        result = "exact" if scenario.exact else f"NOT exact: {scenario.differences[0].detail}"
        seconds = sum(a.seconds for a in scenario.attempts)
        _progress(f"[{n}/{len(plans)}] {name}: {len(scenario.attempts)} attempts, {seconds:.1f} s: {result}")
    summary, remedy = _summary(scenarios)
    wall, once = time.monotonic() - started, first.attempts[0].seconds
    report.update(exact=all(s.exact for s in scenarios), reproducible=True, summary=summary, remedy=remedy)
    report.update(seed=seed, seconds=round(wall, 1), uninterrupted_seconds=round(once, 1))
    report["scenarios"] = [s.to_dict() for s in scenarios]
    if not options.json:
        columns = ("scenario", "interruptions", "result", "first difference", "self-check", "steps lost")
        render.table("lightning-resume check", columns, [_row(s) for s in scenarios])
    cost = f"wall time {wall:.0f} s, {wall / once:.1f}x one uninterrupted run ({once:.1f} s); seed {seed}"
    return _finish(options, report, scenarios, "\n".join(filter(None, (summary, remedy, cost))))


def _finish(options: Options, report: Mapping[str, Any], scenarios: list[Scenario], text: str) -> int:
    if options.json:
        print(json.dumps(report, indent=2))
    else:
        Console().print(text, highlight=False, markup=False, soft_wrap=True)
    return 0 if report["exact"] and scenarios else 1
