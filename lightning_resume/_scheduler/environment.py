"""What the scheduler tells a process about itself, from the environment as a mapping; every variable read
is named in :data:`ENV`."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lightning_resume.exceptions import RunDirError

ENV = {
    "key": "LIGHTNING_RESUME_KEY",
    "slurm_job": "SLURM_JOB_ID",
    "slurm_array_job": "SLURM_ARRAY_JOB_ID",
    "slurm_array_task": "SLURM_ARRAY_TASK_ID",
    "slurm_restart": "SLURM_RESTART_COUNT",
    "slurm_step": "SLURM_STEP_ID",
    "slurm_procid": "SLURM_PROCID",
    "elastic_run": "TORCHELASTIC_RUN_ID",
    "elastic_restart": "TORCHELASTIC_RESTART_COUNT",
    "elastic_max_restarts": "TORCHELASTIC_MAX_RESTARTS",  # the restarts torchrun allows its workers
    "rank": "RANK",
    "local_rank": "LOCAL_RANK",
    "node_rank": "NODE_RANK",
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
    "world_size": "WORLD_SIZE",
    "slurm_ntasks": "SLURM_NTASKS",
    "slurm_step_tasks": "SLURM_STEP_NUM_TASKS",
    "slurm_job_name": "SLURM_JOB_NAME",
    "submitit_executor": "SUBMITIT_EXECUTOR",
    "submitit_signal": "SUBMITIT_PREEMPT_SIGNAL",
    "handoff": "LIGHTNING_RESUME_RUN_DIR",
    "grace_seconds": "LIGHTNING_RESUME_GRACE_SECONDS",
    "slurm_partition": "SLURM_JOB_PARTITION",
    "sbatch_signal": "SBATCH_SIGNAL",
    "elastic_shutdown_arg": "PET_SHUTDOWN_TIMEOUT",
    "elastic_shutdown": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    "elastic_signals": "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "kubernetes": "KUBERNETES_SERVICE_HOST",
    "slurm_end_time": "SLURM_JOB_END_TIME",
    "notice_file": "LIGHTNING_RESUME_NOTICE",
    "check": "LIGHTNING_RESUME_CHECK",
}


class KeySource(str, enum.Enum):
    """Where a session key came from."""

    EXPLICIT = "explicit"
    SLURM = "slurm"
    TORCHELASTIC = "torchelastic"
    NONE = "none"


@dataclass(frozen=True)
class Session:
    """Who this process is, as far as the scheduler says."""

    key: str | None  # the session key that survives a restart, if anything provides one
    source: KeySource
    scheduler_restart: bool
    ids: dict[str, str]  # the scheduler ids recorded in run_meta.json


def _as_int(environ: Mapping[str, str], var: str) -> int:
    """The whole number in ``environ[var]`` (0 if unset or empty); ``RunDirError`` for anything else."""
    value = environ.get(var, "").strip()
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise RunDirError(
            f"{var}={value!r} is not a whole number. The scheduler sets it; a broken value would make "
            "lightning_resume guess whether this is a restart (and which rank this is). Unset or fix it in "
            "the job script."
        ) from None


def slurm_key(environ: Mapping[str, str]) -> str | None:
    """``JOB_ID`` or ``JOB_ID_ARRAYTASK``: stable across requeues of one SLURM job (or array task)."""
    job = environ.get(ENV["slurm_job"])
    if not job:
        return None
    task = environ.get(ENV["slurm_array_task"])
    return f"{job}_{task}" if task else job


def read_session(environ: Mapping[str, str], key: str | None = None) -> Session:
    """The session key (from ``key``, ``$LIGHTNING_RESUME_KEY``, SLURM or TorchElastic, in order) and
    whether the scheduler reports a restart (a restart count ``>= 1``)."""
    restart = _as_int(environ, ENV["slurm_restart"]) >= 1 or _as_int(environ, ENV["elastic_restart"]) >= 1
    recorded = [ENV[name] for name in ("slurm_job", "slurm_array_job", "slurm_array_task", "slurm_restart")]
    recorded += [ENV["elastic_run"], ENV["elastic_restart"]]
    ids = {var.lower(): environ[var] for var in recorded if environ.get(var)}  # {"slurm_job_id": ..., ...}
    explicit = key if key is not None else environ.get(ENV["key"])
    for found, source in (
        (explicit, KeySource.EXPLICIT),
        (slurm_key(environ), KeySource.SLURM),
        (environ.get(ENV["elastic_run"]), KeySource.TORCHELASTIC),
    ):
        if found:
            return Session(key=found, source=source, scheduler_restart=restart, ids=ids)
    return Session(key=None, source=KeySource.NONE, scheduler_restart=False, ids=ids)


def is_global_zero(environ: Mapping[str, str]) -> bool:
    """Whether launchers report this process as global rank 0 (before any process group exists)."""
    if environ.get(ENV["rank"]) or environ.get(ENV["slurm_procid"]):
        return global_rank(environ) == 0
    # Lightning's own launcher sets LOCAL_RANK and NODE_RANK only for the processes it spawns.
    return _as_int(environ, ENV["local_rank"]) == 0 and _as_int(environ, ENV["node_rank"]) == 0


def expects_peers(environ: Mapping[str, str]) -> bool:
    """Whether a launcher started several ranks that will look for a handoff."""
    counts = (ENV["world_size"], ENV["slurm_step_tasks"], ENV["slurm_ntasks"])
    return any(_as_int(environ, var) > 1 for var in counts)


def global_rank(environ: Mapping[str, str]) -> int:
    """This process's global rank as launchers report it before any process group exists (0 if unset)."""
    for var in (ENV["rank"], ENV["slurm_procid"]):
        if environ.get(var):
            return _as_int(environ, var)
    return 0


def launch_key(environ: Mapping[str, str]) -> str | None:
    """A name shared by every rank of one launch (SLURM job, step and restart; TorchElastic run and
    restart; or the rendezvous address), or ``None``; a relaunch may reuse it (``run_dir.handoff`` guards)."""
    job = slurm_key(environ)
    if job:
        step = environ.get(ENV["slurm_step"], "batch")
        restart = environ.get(ENV["slurm_restart"], "0")
        return f"slurm-{job}-step{step}-r{restart}"
    elastic = environ.get(ENV["elastic_run"])
    if elastic:
        return f"elastic-{elastic}-r{environ.get(ENV['elastic_restart'], '0')}"
    addr, port = environ.get(ENV["master_addr"]), environ.get(ENV["master_port"])
    if addr and port:
        return f"local-{addr}-{port}"
    return None


def on_slurm(environ: Mapping[str, str]) -> bool:
    return bool(environ.get(ENV["slurm_job"]))


def slurm_requeue_id(environ: Mapping[str, str]) -> str | None:
    """The id ``scontrol requeue`` needs: ``ARRAYJOB_TASK`` for an array task, else the job id."""
    array_job, task = environ.get(ENV["slurm_array_job"]), environ.get(ENV["slurm_array_task"])
    if array_job and task:
        return f"{array_job}_{task}"
    return environ.get(ENV["slurm_job"]) or None


def under_submitit(environ: Mapping[str, str]) -> bool:
    return environ.get(ENV["submitit_executor"]) == "slurm"


@dataclass(frozen=True)
class CheckSettings:
    """What ``lightning-resume check`` asks of the attempt it launched (``$LIGHTNING_RESUME_CHECK``, JSON)."""

    folder: str  # the check's folder for this run: RunDir's root is ``folder/runs``, the timeline beside it
    steps: int | None = None  # stop fit after this many optimizer steps (None: two epochs or 200 steps)
    every: int | None = None  # RequeueCheckpoint saves every this many steps (None: an eighth of the steps)
    kill: str | None = None  # where this attempt kills its process group, e.g. "step:25"
    driver: int | None = None  # the check's pid: its process group is never killed


def check_settings(environ: Mapping[str, str]) -> CheckSettings | None:
    """The check's settings for this process (``None`` outside ``lightning-resume check``)."""
    text = environ.get(ENV["check"])
    if not text:
        return None
    try:
        return CheckSettings(**json.loads(text))
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"${ENV['check']}={text!r} is not what `lightning-resume check` sets ({e}); unset it."
        ) from e


def timeline_path(folder: Path, rank: int) -> Path:
    """Where a rank of an attempt under ``lightning-resume check`` writes its timeline."""
    return folder / f"timeline.rank-{rank}.jsonl"


def final_path(folder: Path, rank: int) -> Path:
    """Where a rank of an attempt under ``lightning-resume check`` writes its final state."""
    return folder / f"final.rank-{rank}.pt"
