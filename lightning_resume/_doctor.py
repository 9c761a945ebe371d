"""``lightning-resume doctor``: the checks a failed requeue would be debugged with, as plain functions."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from lightning_resume import _signals
from lightning_resume._scheduler import ENV, read_session

OK, WARN, ERROR = "ok", "warn", "error"


@dataclass(frozen=True)
class Finding:
    """One check's result.

    Attributes:
        level: ``ok``, ``warn`` or ``error``.
        check: What was checked.
        detail: What was found.
        hint: What to do (empty when nothing is needed).
    """

    level: str
    check: str
    detail: str
    hint: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def scheduler(environ: Mapping[str, str]) -> list[Finding]:
    session = read_session(environ)
    ids = ", ".join(f"{k}={v}" for k, v in session.ids.items()) or "no scheduler ids"
    found = [
        Finding(
            OK, "scheduler", f"{session.source if session.source != 'explicit' else 'explicit key'}: {ids}"
        )
    ]
    if session.key is None:
        found.append(
            Finding(
                WARN,
                "session key",
                "none: nothing identifies this job across a restart, so a restart starts a new run dir",
                "under Kubernetes or for reruns by hand, set LIGHTNING_RESUME_KEY (or RunDir(key=...))",
            )
        )
    else:
        restart = "restart" if session.scheduler_restart else "first attempt (or unknown)"
        found.append(
            Finding(OK, "session key", f"{session.key!r} from {session.source}; scheduler says: {restart}")
        )
    if _signals.under_submitit(environ):
        found.append(Finding(OK, "submitit", f"preempt signal {_signals.submitit_signal(environ)}"))
    if environ.get(ENV["handoff"]):
        owner = environ[ENV["handoff"]].partition(":")[0]
        found.append(
            Finding(
                WARN,
                "inherited run dir",
                f"{ENV['handoff']} is set (by process {owner}); ranks > 0 spawned by it adopt that run dir",
                f"unset {ENV['handoff']} unless this process was started by a RunDir job's DDP launcher",
            )
        )
    return found


def signals(environ: Mapping[str, str]) -> list[Finding]:
    found = []
    if environ.get("SLURM_JOB_ID"):
        scontrol = shutil.which("scontrol", path=environ.get("PATH"))
        found.append(
            Finding(OK, "scontrol", scontrol)
            if scontrol
            else Finding(
                ERROR,
                "scontrol",
                "not on PATH: no requeue can be issued",
                "add SLURM's bin directory to PATH",
            )
        )
    problems = _signals.known_problems(_signals.handler_table(), environ, preemption_handler=True)
    found += [Finding(WARN, "signal handlers", problem) for problem in problems if "scontrol" not in problem]
    return found


def _device(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        try:
            return os.stat(candidate).st_dev
        except OSError:
            continue
    return None


def storage(root: Path, environ: Mapping[str, str]) -> list[Finding]:
    tmp = Path(environ.get("TMPDIR") or tempfile.gettempdir())
    found = []
    if _device(tmp) != _device(root):
        found.append(
            Finding(
                WARN,
                "TMPDIR",
                f"{tmp} is on another filesystem than the run root {root}",
                "Lightning's own checkpoint writer stages in $TMPDIR and copies across: not atomic. "
                "RequeueCheckpoint and DurableCheckpointIO write atomically in place",
            )
        )
    else:
        found.append(Finding(OK, "TMPDIR", f"{tmp} shares a filesystem with {root}"))
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is None:
        return found
    free = shutil.disk_usage(existing).free
    sizes = [p.stat().st_size for p in root.glob("runs/*/*/*/checkpoints/*.ckpt")] if root.is_dir() else []
    if sizes:
        need = 2 * max(sizes)  # the new checkpoint is written beside the old one
        level = ERROR if free < need else OK
        hint = (
            "free space or move the run root: a save needs room for a second copy" if level == ERROR else ""
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
        found.append(Finding(OK, "free space", f"{free / 2**30:.1f} GiB free under {existing}"))
    return found


def trackers(environ: Mapping[str, str]) -> list[Finding]:
    found = []
    mode = environ.get("WANDB_MODE")
    if mode in (None, "", "online", "run"):
        found.append(
            Finding(
                WARN,
                "wandb",
                "WANDB_MODE is online (the default): runs are sent to "
                + environ.get("WANDB_BASE_URL", "wandb's servers"),
                "set WANDB_MODE=offline if this machine must not upload",
            )
        )
    else:
        found.append(Finding(OK, "wandb", f"WANDB_MODE={mode}"))
    if environ.get("WANDB_RUN_ID"):
        found.append(
            Finding(
                WARN,
                "wandb",
                f"WANDB_RUN_ID={environ['WANDB_RUN_ID']!r} is set: every run started here continues that run",
                "unset it; WandbResume sets it only on a restart",
            )
        )
    swan = environ.get("SWANLAB_MODE")
    if swan in (None, "", "cloud", "online"):
        found.append(
            Finding(
                WARN,
                "swanlab",
                "SWANLAB_MODE is cloud (the default): runs are uploaded",
                "set SWANLAB_MODE=offline (or local) if this machine must not upload",
            )
        )
    else:
        found.append(Finding(OK, "swanlab", f"SWANLAB_MODE={swan}"))
    if environ.get("TRACKIO_DIR"):
        found.append(Finding(OK, "trackio", f"TRACKIO_DIR={environ['TRACKIO_DIR']}"))
    if not environ.get("HF_HUB_OFFLINE") and environ.get("TRACKIO_SPACE_ID"):
        found.append(
            Finding(
                WARN,
                "trackio",
                f"TRACKIO_SPACE_ID={environ['TRACKIO_SPACE_ID']!r}: runs sync to a Hugging Face Space",
            )
        )
    return found


def run_checks(root: Path, environ: Mapping[str, str]) -> list[Finding]:
    """All checks, in the order they are shown."""
    return [*scheduler(environ), *signals(environ), *storage(root, environ), *trackers(environ)]
