"""``lightning-resume doctor``: the checks a failed requeue would be debugged with, as plain functions."""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_resume._compat import versions
from lightning_resume._compat.versions import TESTED, installed, untested
from lightning_resume._scheduler.environment import ENV, KeySource, on_slurm, read_session, under_submitit
from lightning_resume._scheduler.slurm import slurm_output
from lightning_resume._storage.writer import DEFAULT_BYTES, measure_write_speed
from lightning_resume._version import __version__
from lightning_resume.exceptions import RunDirError
from lightning_resume.last_ckpt import auto_cadence
from lightning_resume.preemption import grace, signals
from lightning_resume.run_dir import attempts, layout
from lightning_resume.watchdog import timeouts as watchdog_timeouts


class Level(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    ERROR = "error"


@dataclass(frozen=True)
class Finding:
    """One check's result: what was ``check``ed, what was found (``detail``) and what to do (``hint``)."""

    level: Level
    check: str
    detail: str
    hint: str = ""


def scheduler_checks(environ: Mapping[str, str]) -> list[Finding]:
    try:
        session = read_session(environ)
    except RunDirError as e:
        return [Finding(Level.ERROR, "scheduler", str(e), "fix the variable in the job script")]
    ids = ", ".join(f"{k}={v}" for k, v in session.ids.items()) or "no scheduler ids"
    source = "explicit key" if session.source is KeySource.EXPLICIT else session.source.value
    found = [Finding(Level.OK, "scheduler", f"{source}: {ids}")]
    if session.key is None:
        what = "none: nothing identifies this job across a restart, so a restart starts a new run dir"
        hint = "under Kubernetes or for reruns by hand, set LIGHTNING_RESUME_KEY (or RunDir(key=...))"
        found.append(Finding(Level.WARN, "session key", what, hint))
    else:
        restart = "restart" if session.scheduler_restart else "first attempt (or unknown)"
        what = f"{session.key!r} from {session.source.value}; scheduler says: {restart}"
        found.append(Finding(Level.OK, "session key", what))
    found += _submitit_checks(environ)
    if environ.get(handoff := ENV["handoff"]):
        owner = environ[handoff].partition(":")[0]
        what = f"{handoff} is set (by process {owner}); ranks > 0 spawned by it adopt that run dir"
        hint = f"unset {handoff} unless this process was started by a RunDir job's DDP launcher"
        found.append(Finding(Level.WARN, "inherited run dir", what, hint))
    return found


def _submitit_checks(environ: Mapping[str, str]) -> list[Finding]:
    variable = ENV["submitit_signal"]
    if not under_submitit(environ):
        if variable not in environ:
            return []
        what = f"{variable}={environ[variable]!r} is set, but this is not a submitit job: ignored"
        return [Finding(Level.WARN, "submitit", what, f"unset {variable} if it was inherited by mistake")]
    try:
        return [Finding(Level.OK, "submitit", f"preempt signal {signals.submitit_signal(environ)}")]
    except ValueError as e:
        return [Finding(Level.ERROR, "submitit", str(e), f"set {variable} to a name such as USR2")]


def signal_checks(environ: Mapping[str, str]) -> list[Finding]:
    found = []
    if on_slurm(environ):
        if scontrol := shutil.which("scontrol", path=environ.get("PATH")):
            found.append(Finding(Level.OK, "scontrol", scontrol))
        else:
            what, hint = "not on PATH: no requeue can be issued", "add SLURM's bin directory to PATH"
            found.append(Finding(Level.ERROR, "scontrol", what, hint))
    problems = signals.known_problems(signals.handler_table(), environ, preemption_handler=True)
    return found + [Finding(Level.WARN, "signal handlers", p) for p in problems if "scontrol" not in p]


def _device(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        with contextlib.suppress(OSError):
            return os.stat(candidate).st_dev
    return None


_CHECKPOINTS = f"{layout.CHECKPOINTS}/*{layout.CKPT_SUFFIX}"


def _checkpoint_sizes(root: Path) -> list[int]:
    return [p.stat().st_size for p in layout.run_files(root, _CHECKPOINTS)]


def _newest_first(paths: Iterable[Path]) -> list[Path]:
    """``paths`` by modification time, newest first, without those removed while we looked."""
    found = []
    for path in paths:
        with contextlib.suppress(OSError):
            found.append((path.stat().st_mtime, path))
    return [path for _, path in sorted(found, reverse=True)]


@dataclass(frozen=True)
class WriteSpeed:
    """One timed durable write to the runs root, shared by the checks that need the speed."""

    directory: Path  # where the probe was written: the root, or its nearest existing parent
    nbytes: int
    bytes_per_second: float | None  # None: the write failed, for the reason in error
    error: str = ""


def measure_root(root: Path, nbytes: int = DEFAULT_BYTES) -> WriteSpeed | None:
    """Time one durable write of ``nbytes`` to ``root``; ``None`` when skipped (``nbytes=0``)."""
    existing = next((p for p in (root, *root.parents) if p.is_dir()), None)
    if existing is None or nbytes <= 0:
        return None
    try:
        return WriteSpeed(existing, nbytes, measure_write_speed(existing, nbytes))
    except OSError as e:
        return WriteSpeed(existing, nbytes, None, str(e.strerror or e))


def write_speed_checks(root: Path, speed: WriteSpeed | None) -> list[Finding]:
    """The durable write speed of the run root, and how long its largest checkpoint takes to write."""
    if speed is None:
        return []
    rate = speed.bytes_per_second
    if rate is None:
        hint = "make the run root writable by the user running training"
        what = f"cannot write to {speed.directory}: {speed.error}"
        return [Finding(Level.ERROR, "write speed", what, hint)]
    mib = speed.nbytes / 2**20
    detail = f"{rate / 1e6:,.0f} MB/s durable writes to {speed.directory} ({mib:.0f} MiB + fsync)"
    if sizes := _checkpoint_sizes(root):
        largest = max(sizes)
        detail += f"; the largest checkpoint ({largest / 1e9:.2f} GB) takes ~{largest / rate:.1f} s to write"
    return [Finding(Level.OK, "write speed", detail)]


def _newest_checkpoint(root: Path) -> tuple[Path, int] | None:
    """The most recently written checkpoint under the runs root ``root`` and its size in bytes."""
    for path in _newest_first(layout.run_files(root, _CHECKPOINTS)):
        with contextlib.suppress(OSError):  # removed while we looked
            # A sharded checkpoint is a folder of files.
            files = [path] if not path.is_dir() else [p for p in path.rglob("*") if p.is_file()]
            return path, sum(f.stat().st_size for f in files)
    return None


#: Runs a SLURM client command and returns its output, or ``None`` when it fails.
_SlurmRun = Callable[[Sequence[str]], str | None]


def _slurm_texts(environ: Mapping[str, str], run: _SlurmRun) -> dict[str, str | None]:
    """What SLURM says about this job's grace windows (each ``None`` when it cannot be read)."""
    job = environ.get(ENV["slurm_job"], "")
    partition = environ.get(ENV["slurm_partition"], "")
    config = run(["scontrol", "show", "config"])
    if config is None:  # no controller, or no SLURM here: the other commands would only time out too
        return {"show_config": None, "show_partition": None, "submit_line": None, "batch_script": None}
    return {
        "show_config": config,
        "show_partition": run(["scontrol", "show", "partition", partition]) if partition else None,
        # In accounting about a second after the job starts; the batch script is there at once.
        "submit_line": run(["sacct", "-X", "-j", job, "-o", "SubmitLine%1000", "-P", "-n"]),
        "batch_script": run(["scontrol", "write", "batch_script", job, "-"]),
    }


def _mib(nbytes: float) -> str:
    if nbytes >= 2**30:
        return f"{grace.number_text(nbytes / 2**30)} GiB"
    return f"{grace.number_text(nbytes / 2**20)} MiB"


def _grace(level: Level, detail: str, hint: str = "") -> Finding:
    return Finding(level, "grace window", detail, hint)


def _window_finding(
    window: grace.Window, checkpoint: tuple[Path, int] | None, speed: WriteSpeed | None
) -> Finding:
    head = f"{window.label}: {grace.number_text(window.seconds)} s ({window.origin})"
    rate = speed.bytes_per_second if speed else None
    if checkpoint is None:
        if rate is None:
            return _grace(Level.OK, f"{head}; no checkpoint and no write test: no estimate")
        fitting = _mib(grace.largest_fitting_bytes(window.seconds, rate))
        at = f"at {_mib(rate)}/s durable, a checkpoint of up to {fitting} fits"
        return _grace(Level.OK, f"{head}; no checkpoint under the root yet, so no estimate: {at}")
    path, size = checkpoint
    if rate is None:
        what = f"{head}; {path.name} {_mib(size)}, write speed not measured: no estimate"
        return _grace(Level.OK, what, "run without --write-test 0 to compare the save time with the window")
    need = grace.save_seconds(size, rate)
    needs = f"a save needs ~{grace.number_text(need)} s"
    detail = f"{head}; {path.name} {_mib(size)} at {_mib(rate)}/s durable: {needs}"
    if grace.fits(need, window.seconds):
        return _grace(Level.OK, detail)
    more = f"{detail}, more than {grace.FIT_SHARE:.0%} of the window"
    return _grace(Level.WARN, more, grace.advice(window, need))


def grace_checks(
    root: Path, environ: Mapping[str, str], speed: WriteSpeed | None, run: _SlurmRun | None = None
) -> list[Finding]:
    """Each stop-signal-to-SIGKILL window against a save of the newest checkpoint (``run``: SLURM's)."""
    if run is None:
        run = functools.partial(slurm_output, path=environ.get("PATH"))
    texts = _slurm_texts(environ, run) if on_slurm(environ) else {}
    try:
        found = grace.windows(environ, **texts)
    except ValueError as e:
        return [_grace(Level.ERROR, str(e), "fix or unset the variable")]
    variable = ENV["grace_seconds"]
    findings = []
    if texts and texts["show_config"] is None and not environ.get(variable, "").strip():
        what = "slurm: `scontrol show config` gave nothing, so KillWait is unknown"
        hint = f"put SLURM's bin directory on PATH, or set {variable} to the seconds from the stop signal"
        findings.append(_grace(Level.WARN, what, f"{hint} to SIGKILL"))
    if not found and not findings:
        what = (
            "no scheduler window found (not in a SLURM job, torchrun or Kubernetes): nothing to check "
            "the save time against"
        )
        hint = f"set {variable}=N to check a save against N seconds from stop signal to SIGKILL"
        return [_grace(Level.OK, what, hint)]
    checkpoint = _newest_checkpoint(root)
    findings += [_window_finding(window, checkpoint, speed) for window in found]
    option = grace.slurm_signal(environ, texts["submit_line"], texts["batch_script"]) if texts else None
    if option is not None and grace.torchrun_kills(environ, option):
        name, forwarded = option.name, ",".join(grace.torchrun_forwards(environ))
        what = (
            f"SLURM's --signal sends {name}, which torchrun does not forward ({forwarded}): "
            "it kills the torchrun agent and its workers without a save"
        )
        findings.append(_grace(Level.WARN, what, f"torchrun --signals-to-handle={forwarded},{name}"))
    return findings


def storage_checks(root: Path, environ: Mapping[str, str]) -> list[Finding]:
    tmp = Path(environ.get("TMPDIR") or tempfile.gettempdir())
    if _device(tmp) != _device(root):
        hint = (
            "Lightning's own checkpoint writer stages in $TMPDIR and copies across: not atomic. "
            "RequeueCheckpoint and DurableCheckpointIO write atomically in place"
        )
        what = f"{tmp} is on another filesystem than the run root {root}"
        found = [Finding(Level.WARN, "TMPDIR", what, hint)]
    else:
        found = [Finding(Level.OK, "TMPDIR", f"{tmp} shares a filesystem with {root}")]
    existing = next(p for p in (root, *root.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if sizes := _checkpoint_sizes(root):
        short = free < 2 * max(sizes)  # the new checkpoint is written beside the old one
        hint = "free space or move the run root: a save needs room for a second copy" if short else ""
        what = f"{free / 2**30:.1f} GiB free, largest checkpoint {max(sizes) / 2**30:.2f} GiB"
        found.append(Finding(Level.ERROR if short else Level.OK, "free space", what, hint))
    else:
        found.append(Finding(Level.OK, "free space", f"{free / 2**30:.1f} GiB free under {existing}"))
    return found


def _upload_mode(
    environ: Mapping[str, str], tracker: str, variable: str, uploading: tuple[str, ...]
) -> Finding:
    """Whether ``tracker``'s mode variable leaves it uploading (its default)."""
    mode = environ.get(variable)
    if mode in (None, "", *uploading):
        what = f"{variable} is {uploading[0]} (the default): runs are uploaded"
        return Finding(Level.WARN, tracker, what, f"set {variable}=offline if this machine must not upload")
    return Finding(Level.OK, tracker, f"{variable}={mode}")


def tracker_checks(environ: Mapping[str, str]) -> list[Finding]:
    found = [_upload_mode(environ, "wandb", "WANDB_MODE", ("online", "run"))]
    if run_id := environ.get("WANDB_RUN_ID"):
        what = f"WANDB_RUN_ID={run_id!r} is set: every run started here continues that run"
        found.append(Finding(Level.WARN, "wandb", what, "unset it; WandbResume sets it only on a restart"))
    found.append(_upload_mode(environ, "swanlab", "SWANLAB_MODE", ("cloud", "online")))
    if environ.get("TRACKIO_DIR"):
        found.append(Finding(Level.OK, "trackio", f"TRACKIO_DIR={environ['TRACKIO_DIR']}"))
    if not environ.get("HF_HUB_OFFLINE") and (space := environ.get("TRACKIO_SPACE_ID")):
        what = f"TRACKIO_SPACE_ID={space!r}: runs sync to a Hugging Face Space"
        found.append(Finding(Level.WARN, "trackio", what))
    return found


#: Lightning's process-group timeout for gloo and NCCL (``default_pg_timeout``), unless the strategy
#: is given another (``DDPStrategy(timeout=...)``, which doctor cannot see).
COLLECTIVE_TIMEOUT = 1800.0
#: A collective timeout this many times the watchdog's step timeout counts as far longer.
FAR_LONGER = 4.0


def _collective_timeout(environ: Mapping[str, str]) -> tuple[float, str]:
    """Seconds a collective waits for a stuck peer before it fails, and where that comes from."""
    no_abort = environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "").strip() == "0"
    blocking = environ.get("TORCH_NCCL_BLOCKING_WAIT", "").strip().lower() in ("1", "true")
    if no_abort and not blocking:
        return float("inf"), "TORCH_NCCL_ASYNC_ERROR_HANDLING=0: NCCL never aborts a timed-out collective"
    return COLLECTIVE_TIMEOUT, "Lightning's default process-group timeout for gloo and NCCL"


def hang_checks(root: Path, environ: Mapping[str, str]) -> list[Finding]:
    """How long a rank stuck in a collective holds the others, against ``ProgressWatchdog``'s step timeout."""
    collective, origin = _collective_timeout(environ)
    seconds = "never" if collective == float("inf") else f"{collective:.0f} s"
    newest = _newest_first(layout.run_files(root, layout.WATCHDOG))  # the run that used it last
    if not newest:
        floor = watchdog_timeouts.WatchdogTimeouts().minimum
        if collective < FAR_LONGER * floor:
            return [Finding(Level.OK, "hang detection", f"collectives fail after {seconds} ({origin})")]
        what = (
            f"a rank stuck in a collective holds every rank for {seconds} ({origin}), far longer than "
            f"ProgressWatchdog's {floor:.0f} s, and no run under {root} used ProgressWatchdog"
        )
        hint = (
            "add ProgressWatchdog() to the callbacks: a hung rank then exits with its stacks and the job "
            "restarts (or lower DDPStrategy(timeout=...))"
        )
        return [Finding(Level.WARN, "hang detection", what, hint)]
    run_dir = newest[0].parent
    try:
        step = float((watchdog_timeouts.read(run_dir).get("timeouts") or {})["step"])
    except (KeyError, TypeError, ValueError):
        return [Finding(Level.WARN, "hang detection", f"{run_dir / layout.WATCHDOG} cannot be read")]
    if collective < step:
        what = (
            f"collectives fail after {seconds} ({origin}), before ProgressWatchdog's step timeout "
            f"({step:.0f} s in {run_dir.name}): a hang ends as a collective error, without the stacks"
        )
        hint = "lower WatchdogTimeouts(step=...) or raise DDPStrategy(timeout=...)"
        return [Finding(Level.WARN, "hang detection", what, hint)]
    what = (
        f"ProgressWatchdog ends a hang after ~{step:.0f} s (step timeout in {run_dir.name}); collectives "
        f"fail after {seconds} ({origin})"
    )
    return [Finding(Level.OK, "hang detection", what)]


def cadence_checks(root: Path) -> list[Finding]:
    """The interval ``every_n_train_steps="auto"`` chose last, in the newest run under ``root`` using it."""
    for run_dir in (path.parent for path in _newest_first(layout.run_files(root, layout.ATTEMPTS))):
        record = auto_cadence.last_cadence(attempts.read(run_dir))
        chosen = auto_cadence.choice_from_dict(record) if record is not None else None
        if chosen is not None:
            detail = f"{run_dir.name}: every_n_train_steps='auto' saves {chosen.describe()}"
            return [Finding(Level.OK, "checkpoint cadence", detail)]
    return []


def version_checks() -> list[Finding]:
    """This package's version and origin; Python, Lightning and torch against the ranges tested."""
    where = Path(__file__).resolve().parents[1]
    found = [Finding(Level.OK, "lightning-resume", f"{__version__}, imported from {where}")]
    python = versions.untested_python(sys.version_info[:3])
    if python is None:
        found.append(Finding(Level.OK, "python", f"{platform.python_version()}: within the tested range"))
    else:
        hint = "CI runs the exactness core on Python {} to {}: use one of them".format(*versions.PYTHON)
        found.append(Finding(Level.WARN, "python", python, hint))
    for distribution in TESTED:
        version, problem = installed(distribution), untested(distribution)
        if version is None:
            continue
        if problem is None:
            found.append(Finding(Level.OK, distribution, f"{version}: within the tested range"))
            continue
        hint = (
            "lightning_resume reaches into a few internals of it (all in lightning_resume/_compat): run "
            "the pins, `pytest tests/_compat` from a checkout of lightning_resume, or use a tested version"
        )
        level = Level.ERROR if "older" in problem else Level.WARN
        found.append(Finding(level, distribution, problem, hint))
    return found


def run_checks(root: Path, environ: Mapping[str, str], write_bytes: int = DEFAULT_BYTES) -> list[Finding]:
    """All checks, in the order they are shown (``write_bytes=0`` skips the timed write)."""
    speed = measure_root(root, write_bytes)  # once, for the write speed and the grace windows
    return [
        *version_checks(),
        *scheduler_checks(environ),
        *signal_checks(environ),
        *storage_checks(root, environ),
        *write_speed_checks(root, speed),
        *grace_checks(root, environ, speed),
        *hang_checks(root, environ),
        *cadence_checks(root),
        *tracker_checks(environ),
    ]
