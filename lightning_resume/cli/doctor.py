"""``lightning-resume doctor``: the checks a failed requeue would be debugged with, as plain functions."""

from __future__ import annotations

import enum
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lightning_resume._run import layout, signals
from lightning_resume._run.scheduler import ENV, KeySource, on_slurm, read_session, under_submitit
from lightning_resume._writer.write_speed import DEFAULT_BYTES, measure_write_speed
from lightning_resume.exceptions import RunDirError


class Level(str, enum.Enum):
    """How serious a finding is."""

    OK = "ok"
    WARN = "warn"
    ERROR = "error"


@dataclass(frozen=True)
class Finding:
    """One check's result.

    Attributes:
        level: ``ok``, ``warn`` or ``error``.
        check: What was checked.
        detail: What was found.
        hint: What to do (empty when nothing is needed).
    """

    level: Level
    check: str
    detail: str
    hint: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"level": self.level.value, "check": self.check, "detail": self.detail, "hint": self.hint}


def scheduler_checks(environ: Mapping[str, str]) -> list[Finding]:
    try:
        session = read_session(environ)
    except RunDirError as e:
        return [Finding(Level.ERROR, "scheduler", str(e), "fix the variable in the job script")]
    ids = ", ".join(f"{k}={v}" for k, v in session.ids.items()) or "no scheduler ids"
    found = [
        Finding(
            Level.OK,
            "scheduler",
            f"{'explicit key' if session.source is KeySource.EXPLICIT else session.source.value}: {ids}",
        )
    ]
    if session.key is None:
        found.append(
            Finding(
                Level.WARN,
                "session key",
                "none: nothing identifies this job across a restart, so a restart starts a new run dir",
                "under Kubernetes or for reruns by hand, set LIGHTNING_RESUME_KEY (or RunDir(key=...))",
            )
        )
    else:
        restart = "restart" if session.scheduler_restart else "first attempt (or unknown)"
        found.append(
            Finding(
                Level.OK,
                "session key",
                f"{session.key!r} from {session.source.value}; scheduler says: {restart}",
            )
        )
    found += _submitit_checks(environ)
    if environ.get(ENV["handoff"]):
        owner = environ[ENV["handoff"]].partition(":")[0]
        found.append(
            Finding(
                Level.WARN,
                "inherited run dir",
                f"{ENV['handoff']} is set (by process {owner}); ranks > 0 spawned by it adopt that run dir",
                f"unset {ENV['handoff']} unless this process was started by a RunDir job's DDP launcher",
            )
        )
    return found


def _submitit_checks(environ: Mapping[str, str]) -> list[Finding]:
    variable = ENV["submitit_signal"]
    if not under_submitit(environ):
        if variable in environ:
            return [
                Finding(
                    Level.WARN,
                    "submitit",
                    f"{variable}={environ[variable]!r} is set, but this is not a submitit job: ignored",
                    f"unset {variable} if it was inherited by mistake",
                )
            ]
        return []
    try:
        return [Finding(Level.OK, "submitit", f"preempt signal {signals.submitit_signal(environ)}")]
    except ValueError as e:
        return [Finding(Level.ERROR, "submitit", str(e), f"set {variable} to a name such as USR2")]


def signal_checks(environ: Mapping[str, str]) -> list[Finding]:
    found = []
    if on_slurm(environ):
        scontrol = shutil.which("scontrol", path=environ.get("PATH"))
        found.append(
            Finding(Level.OK, "scontrol", scontrol)
            if scontrol
            else Finding(
                Level.ERROR,
                "scontrol",
                "not on PATH: no requeue can be issued",
                "add SLURM's bin directory to PATH",
            )
        )
    problems = signals.known_problems(signals.handler_table(), environ, preemption_handler=True)
    found += [
        Finding(Level.WARN, "signal handlers", problem) for problem in problems if "scontrol" not in problem
    ]
    return found


def _device(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        try:
            return os.stat(candidate).st_dev
        except OSError:
            continue
    return None


def _checkpoint_sizes(root: Path) -> list[int]:
    """Sizes of the checkpoint files of every run dir under the runs root ``root``."""
    if not root.is_dir():
        return []
    return [
        p.stat().st_size for p in root.glob(f"{layout.RUN_GLOB}/{layout.CHECKPOINTS}/*{layout.CKPT_SUFFIX}")
    ]


def write_speed_checks(root: Path, nbytes: int = DEFAULT_BYTES) -> list[Finding]:
    """The durable write speed of the run root (a timed write + fsync of a temporary file).

    With checkpoints under the root, also the seconds the largest one needs to become durable, the
    floor of what a preemption's grace period must allow for the last save.
    """
    existing = next((p for p in (root, *root.parents) if p.is_dir()), None)
    if existing is None or nbytes <= 0:
        return []
    try:
        speed = measure_write_speed(existing, nbytes)
    except OSError as e:
        return [
            Finding(
                Level.ERROR,
                "write speed",
                f"cannot write to {existing}: {e.strerror or e}",
                "make the run root writable by the user running training",
            )
        ]
    detail = f"{speed / 1e6:,.0f} MB/s durable writes to {existing} ({nbytes / 2**20:.0f} MiB + fsync)"
    sizes = _checkpoint_sizes(root)
    if sizes:
        largest = max(sizes)
        detail += f"; the largest checkpoint ({largest / 1e9:.2f} GB) takes ~{largest / speed:.1f} s to write"
    return [Finding(Level.OK, "write speed", detail)]


def storage_checks(root: Path, environ: Mapping[str, str]) -> list[Finding]:
    tmp = Path(environ.get("TMPDIR") or tempfile.gettempdir())
    found = []
    if _device(tmp) != _device(root):
        found.append(
            Finding(
                Level.WARN,
                "TMPDIR",
                f"{tmp} is on another filesystem than the run root {root}",
                "Lightning's own checkpoint writer stages in $TMPDIR and copies across: not atomic. "
                "RequeueCheckpoint and DurableCheckpointIO write atomically in place",
            )
        )
    else:
        found.append(Finding(Level.OK, "TMPDIR", f"{tmp} shares a filesystem with {root}"))
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is None:
        return found
    free = shutil.disk_usage(existing).free
    sizes = _checkpoint_sizes(root)
    if sizes:
        need = 2 * max(sizes)  # the new checkpoint is written beside the old one
        level = Level.ERROR if free < need else Level.OK
        hint = (
            "free space or move the run root: a save needs room for a second copy"
            if level == Level.ERROR
            else ""
        )
        found.append(
            Finding(
                level,
                "free space",
                f"{free / 2**30:.1f} GiB free, largest checkpoint {max(sizes) / 2**30:.2f} GiB",
                hint,
            )
        )
    else:
        found.append(Finding(Level.OK, "free space", f"{free / 2**30:.1f} GiB free under {existing}"))
    return found


def _upload_mode(
    environ: Mapping[str, str], tracker: str, variable: str, uploading: tuple[str, ...]
) -> Finding:
    """Whether ``tracker``'s mode variable leaves it uploading (its default)."""
    mode = environ.get(variable)
    if mode in (None, "", *uploading):
        return Finding(
            Level.WARN,
            tracker,
            f"{variable} is {uploading[0]} (the default): runs are uploaded",
            f"set {variable}=offline if this machine must not upload",
        )
    return Finding(Level.OK, tracker, f"{variable}={mode}")


def tracker_checks(environ: Mapping[str, str]) -> list[Finding]:
    found = [_upload_mode(environ, "wandb", "WANDB_MODE", ("online", "run"))]
    if environ.get("WANDB_RUN_ID"):
        found.append(
            Finding(
                Level.WARN,
                "wandb",
                f"WANDB_RUN_ID={environ['WANDB_RUN_ID']!r} is set: every run started here continues that run",
                "unset it; WandbResume sets it only on a restart",
            )
        )
    found.append(_upload_mode(environ, "swanlab", "SWANLAB_MODE", ("cloud", "online")))
    if environ.get("TRACKIO_DIR"):
        found.append(Finding(Level.OK, "trackio", f"TRACKIO_DIR={environ['TRACKIO_DIR']}"))
    if not environ.get("HF_HUB_OFFLINE") and environ.get("TRACKIO_SPACE_ID"):
        found.append(
            Finding(
                Level.WARN,
                "trackio",
                f"TRACKIO_SPACE_ID={environ['TRACKIO_SPACE_ID']!r}: runs sync to a Hugging Face Space",
            )
        )
    return found


def run_checks(root: Path, environ: Mapping[str, str], write_bytes: int = DEFAULT_BYTES) -> list[Finding]:
    """All checks, in the order they are shown (``write_bytes=0`` skips the timed write)."""
    return [
        *scheduler_checks(environ),
        *signal_checks(environ),
        *storage_checks(root, environ),
        *write_speed_checks(root, write_bytes),
        *tracker_checks(environ),
    ]
