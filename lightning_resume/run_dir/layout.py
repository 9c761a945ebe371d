"""The on-disk layout of a runs root and of a run dir: every file name and glob in one place.

::

    <root>/
        YYYYMMDD/HHMMSS/<run id>/          one folder per run (a "run dir")
            run_meta.json                  who created the run, under which session key
            status.json                    how the latest attempt stands
            attempts.json                  every attempt: start, resumed step, checkpoints, end (RunDir)
            saves.json                     whether the run committed a checkpoint; what its checkpoints pickle
            watchdog.json                  ProgressWatchdog's settings and the slowest time seen per section
            hangs/attempt-N-rank-R.txt     a hung rank's Python stacks (.json beside it: where, how long)
            .lock                          locked by the live attempt that trains here
            checkpoints/last.ckpt          the checkpoint a restart resumes from
            checkpoints/.validated-after   the step of the last save that a validation followed
            .self-check/rank-R.step-S.json each rank's first step after the save of step S (the self-check)
            <tracker>_resume.json          tracker sidecars (also tensorboard_resume.json, csv_resume.json)
            logs/tensorboard, logs/csv     links to the TensorBoard/CSV version dirs (LocalLoggerResume)
            logs/.positions.json           each log's length at the recent saves (where a restart cuts)
            config.yaml                    LightningCLI's configuration (config.1.yaml, ...: earlier ones)
            hydra_config.yaml              Hydra's composed configuration (hydra_config.1.yaml, ...)
        .index/<session key>               the run dir a session key belongs to, relative to the root
        .handoff/<launch key>              rank 0's choice, for the other ranks of one launch
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

INDEX_DIR = ".index"
HANDOFF_DIR = ".handoff"
RUN_META = "run_meta.json"
STATUS = "status.json"
ATTEMPTS = "attempts.json"
WATCHDOG = "watchdog.json"
HANGS = "hangs"
LOCK = ".lock"
CHECKPOINTS = "checkpoints"
LAST = "last"
CKPT_SUFFIX = ".ckpt"
LAST_CKPT = f"{LAST}{CKPT_SUFFIX}"
SAVES = "saves.json"
VALIDATED_AFTER = ".validated-after"  # that validation is redone on restart
LOGS = "logs"
SELF_CHECK = ".self-check"
_DAY, _TIME = "[0-9]" * 8, "[0-9]" * 6
RUN_GLOB = f"{_DAY}/{_TIME}/*"  # run dirs relative to the root: ``YYYYMMDD/HHMMSS/<run id>``
RUN_DEPTH = 3  # how many folders a run dir sits below its root


def self_check_dir(run_dir: Path) -> Path:
    """Where each rank records the first step after a save, for a resume to compare with."""
    return run_dir / SELF_CHECK


def new_run_dir(root: Path, now: datetime, run_id: str) -> Path:
    """Where a run created at ``now`` with ``run_id`` lives: ``root/YYYYMMDD/HHMMSS/<run_id>``."""
    return root / now.strftime("%Y%m%d") / now.strftime("%H%M%S") / run_id


def run_files(root: Path, pattern: str) -> list[Path]:
    """The paths matching ``pattern`` inside every run dir under ``root``, sorted."""
    return sorted(root.glob(f"{RUN_GLOB}/{pattern}"))


def run_dirs(root: Path) -> list[Path]:
    """Every run dir under ``root`` (folders holding a ``run_meta.json``), sorted."""
    return [meta.parent for meta in run_files(root, RUN_META)]


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a ``run_meta.json``."""
    return (path / RUN_META).is_file()


def is_root(path: Path) -> bool:
    """Whether ``path`` looks like a runs root: it has ``.index/`` or run dirs."""
    return (path / INDEX_DIR).is_dir() or bool(run_dirs(path))


def root_of(run_dir: Path) -> Path:
    """The root a run dir was created under (``IndexError``: too short a path for a run dir)."""
    return run_dir.parents[RUN_DEPTH - 1]


def is_run_place(root: Path, path: Path) -> bool:
    """Whether ``path`` is where a run dir of ``root`` lives, ``YYYYMMDD/HHMMSS/<id>`` (symlinks resolved)."""
    try:
        parts = path.resolve().relative_to(root.resolve()).parts
    except ValueError:
        return False
    if len(parts) != RUN_DEPTH:
        return False
    day, time = parts[:2]
    return len(day) == 8 and day.isdigit() and len(time) == 6 and time.isdigit() and bool(parts[2])


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / CHECKPOINTS


def last_checkpoint(run_dir: Path) -> Path:
    return checkpoint_dir(run_dir) / LAST_CKPT


def saves_record(run_dir: Path) -> Path:
    """``<run dir>/saves.json``, beside (not in) ``checkpoints/``: it outlives a lost checkpoint folder."""
    return run_dir / SAVES


def validated_after(run_dir: Path) -> Path:
    """``<run dir>/checkpoints/.validated-after``: the step of the last save a validation followed."""
    return checkpoint_dir(run_dir) / VALIDATED_AFTER


def hangs_dir(run_dir: Path) -> Path:
    return run_dir / HANGS


def logs_link(run_dir: Path, kind: str) -> Path:
    """The link in ``run_dir`` to the version dir of its ``kind`` logger (``"tensorboard"``, ``"csv"``)."""
    return run_dir / LOGS / kind
