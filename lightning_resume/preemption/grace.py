"""The grace window: the seconds from a scheduler's stop signal to SIGKILL, and whether a save fits in it
(plain functions over the environment and scheduler output; checked with Slurm 22.05, torch 2.13)."""

from __future__ import annotations

import contextlib
import enum
import math
import re
import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from lightning_resume._scheduler.environment import ENV
from lightning_resume.preemption.signals import full_name

TORCHRUN_DEFAULT_SECONDS = 30  # torchrun's shutdown timeout when no variable sets it
KUBERNETES_DEFAULT_SECONDS = 30  # terminationGracePeriodSeconds' default
SLURM_DEFAULT_LEAD_SECONDS = 60  # --signal=SIG without @LEAD
TORCHRUN_DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torchrun's --signals-to-handle
#: Factor on the measured write time for pickling and copying off the GPU: an allowance, not a measurement.
SAVE_OVERHEAD = 1.5
#: The share of a window a save may take: the step in flight ends before it, the exit comes after it.
FIT_SHARE = 0.8


class Kind(str, enum.Enum):
    """Which rule of which scheduler a window comes from."""

    EXPLICIT = "explicit"
    SLURM_KILL_WAIT = "slurm KillWait"
    SLURM_PREEMPTION = "slurm preemption"
    SLURM_SIGNAL = "slurm --signal"
    TORCHRUN = "torchrun"
    KUBERNETES = "kubernetes"


@dataclass(frozen=True)
class Window:
    """The ``seconds`` from ``signal`` to SIGKILL under rule ``kind``, and their ``origin`` for reports."""

    kind: Kind
    signal: str
    seconds: float
    origin: str
    fixed: float = 0.0  # the part the job cannot change (the cluster's KillWait under a --signal lead)

    @property
    def label(self) -> str:
        """``slurm SIGUSR1``, ``slurm preemption``, ``torchrun SIGTERM``, ..."""
        if self.kind is Kind.SLURM_PREEMPTION:
            return self.kind.value
        return f"{self.kind.value.split()[0]} {self.signal}"


@dataclass(frozen=True)
class SlurmSignal:
    """A job's ``--signal=[R|B:]SIG[@LEAD]``: ``name``, ``lead`` s before the end (``B:``: ``batch_only``)."""

    name: str
    lead: float
    batch_only: bool


def number_text(value: float) -> str:
    """``95``, ``1.4``, ``0.001``: a number of seconds or MiB for a report line, without false precision."""
    if value == int(value) or value >= 10:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 0.1 else f"{value:.2g}"


def _config_value(text: str, key: str) -> str | None:
    """The value of ``key`` in ``KEY = VALUE`` lines (``scontrol show config``)."""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.strip()
    return None


def kill_wait(show_config: str) -> float | None:
    """``KillWait`` in seconds from ``scontrol show config`` (``KillWait = 30 sec``), if present."""
    value = _config_value(show_config, "KillWait")
    match = re.fullmatch(r"(\d+)(?:\s*sec)?", value or "")
    return float(match.group(1)) if match else None


def preemption_enabled(show_config: str) -> bool:
    """Whether the cluster preempts at all (``PreemptType`` other than ``preempt/none``)."""
    return (_config_value(show_config, "PreemptType") or "preempt/none") != "preempt/none"


def partition_grace_time(show_partition: str) -> float | None:
    """``GraceTime`` from ``scontrol show partition NAME``, or ``None`` when its jobs are not preempted."""
    fields = dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", show_partition))
    if fields.get("PreemptMode", "OFF").upper() == "OFF":
        return None
    grace = fields.get("GraceTime", "")
    return float(grace) if grace.isdigit() else None


def parse_signal_spec(spec: str) -> SlurmSignal:
    """``B:USR1@90`` -> ``SlurmSignal("SIGUSR1", 90, batch_only=True)``; ValueError if not a ``--signal``."""
    match = re.fullmatch(r"(?:([RB]{1,2}):)?(\w+)(?:@(\d+))?", spec.strip())
    if not match:
        raise ValueError(f"{spec!r} is not a SLURM signal spec of the form [R|B:]SIG[@LEAD], e.g. B:USR1@90.")
    flags, sig, lead = match.groups()
    try:
        name = signal.Signals(int(sig)).name if sig.isdigit() else signal.Signals[full_name(sig)].name
    except (KeyError, ValueError):
        raise ValueError(f"{spec!r}: {sig!r} is not a signal.") from None
    return SlurmSignal(name, float(lead) if lead else SLURM_DEFAULT_LEAD_SECONDS, "B" in (flags or ""))


def _words(line: str) -> list[str]:
    # sacct prints the submit line without the shell's quotes (``--wrap=sleep 2``): they may not pair.
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def _signal_option(words: list[str]) -> SlurmSignal | None:
    """The last valid ``--signal`` among command-line words: as for sbatch, a later one overrides."""
    found = None
    for i, word in enumerate(words):
        if word.startswith("--signal="):
            spec = word.partition("=")[2]
        elif word == "--signal" and i + 1 < len(words):
            spec = words[i + 1]
        else:
            continue
        with contextlib.suppress(ValueError):
            found = parse_signal_spec(spec)
    return found


def submit_line_signal(submit_line: str) -> SlurmSignal | None:
    """``--signal`` from ``sacct -o SubmitLine`` (``sbatch --signal=B:USR1@90 job.sh``)."""
    return _signal_option(_words(submit_line))


def batch_script_signal(batch_script: str) -> SlurmSignal | None:
    """``--signal`` from the ``#SBATCH`` lines of a script: as sbatch, to the first command; the last wins."""
    found = None
    for line in batch_script.splitlines()[1:]:  # the first line is the #! line
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            found = _signal_option(_words(stripped.removeprefix("#SBATCH"))) or found
        elif stripped and not stripped.startswith("#"):
            break
    return found


def slurm_signal(
    environ: Mapping[str, str], submit_line: str | None = None, batch_script: str | None = None
) -> SlurmSignal | None:
    """The job's ``--signal``: the submit line's, else ``$SBATCH_SIGNAL`` (ValueError if sbatch would refuse
    it), else the batch script's."""
    found = submit_line_signal(submit_line) if submit_line else None
    if found:
        return found
    variable = ENV["sbatch_signal"]
    if environ.get(variable):
        try:
            return parse_signal_spec(environ[variable])
        except ValueError as e:
            raise ValueError(f"{variable}={environ[variable]!r}: {e}") from None
    return batch_script_signal(batch_script) if batch_script else None


def _positive_seconds(environ: Mapping[str, str], variable: str) -> float:
    text = environ[variable]
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{variable}={text!r} is not a number of seconds > 0. Set it to the seconds the scheduler "
            "leaves between its stop signal and SIGKILL (e.g. 120), or unset it."
        )
    return value


def torchrun_shutdown_timeout(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """Under torchrun, its seconds from forwarding a signal to SIGKILL, and their origin."""
    # The environment forms of --shutdown-timeout ($PET_..., then $TORCH_ELASTIC_...): workers cannot see it.
    if not environ.get(ENV["elastic_run"]):
        return None
    for variable in (ENV["elastic_shutdown_arg"], ENV["elastic_shutdown"]):
        text = environ.get(variable, "").strip()
        if not text:
            continue
        if not text.isdigit():
            raise ValueError(
                f"{variable}={text!r} is not a whole number of seconds >= 0 (torchrun needs one)."
            )
        return int(text), f"${variable}"
    return TORCHRUN_DEFAULT_SECONDS, "torchrun's default shutdown timeout"


def torchrun_forwards(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The signals the torchrun agent forwards to its workers (the others kill it)."""
    names = environ.get(ENV["elastic_signals"], "").strip()
    if not names:
        return TORCHRUN_DEFAULT_SIGNALS
    return tuple(full_name(name.strip()) for name in names.split(",") if name.strip())


def windows(
    environ: Mapping[str, str],
    show_config: str | None = None,
    show_partition: str | None = None,
    submit_line: str | None = None,
    batch_script: str | None = None,
) -> list[Window]:
    """Every stop-signal-to-SIGKILL window here (only the explicit one if ``$LIGHTNING_RESUME_GRACE_SECONDS``
    is set); SLURM's need ``scontrol``'s and ``sacct``'s outputs; ValueError for a variable's bad value."""
    variable = ENV["grace_seconds"]
    if environ.get(variable, "").strip():
        return [Window(Kind.EXPLICIT, "SIGTERM", _positive_seconds(environ, variable), f"${variable}")]
    found: list[Window] = []
    if environ.get(ENV["slurm_job"]):
        found += _slurm_windows(environ, show_config, show_partition, submit_line, batch_script)
    torchrun = torchrun_shutdown_timeout(environ)
    if torchrun is not None:
        found.append(Window(Kind.TORCHRUN, "SIGTERM", torchrun[0], torchrun[1]))
    if environ.get(ENV["kubernetes"]):
        origin = (
            f"assumed: terminationGracePeriodSeconds' default, not visible in the pod; ${variable} "
            "states the real one"
        )
        found.append(Window(Kind.KUBERNETES, "SIGTERM", KUBERNETES_DEFAULT_SECONDS, origin))
    return found


def _slurm_windows(
    environ: Mapping[str, str],
    show_config: str | None,
    show_partition: str | None,
    submit_line: str | None,
    batch_script: str | None,
) -> list[Window]:
    wait = kill_wait(show_config) if show_config else None
    found = []
    if wait is not None:
        found.append(Window(Kind.SLURM_KILL_WAIT, "SIGTERM", wait, "KillWait"))
        grace = partition_grace_time(show_partition) if show_partition else None
        if grace and show_config and preemption_enabled(show_config):
            partition = " ".join(("partition", environ.get(ENV["slurm_partition"], ""))).strip()
            origin = f"{partition} GraceTime {number_text(grace)} s + KillWait"
            found.append(Window(Kind.SLURM_PREEMPTION, "SIGTERM", grace + wait, origin, fixed=wait))
    option = slurm_signal(environ, submit_line, batch_script)
    if option is not None:
        shell = ", to the batch shell only" if option.batch_only else ""
        killwait = ", KillWait unknown" if wait is None else " + KillWait"
        origin = f"--signal lead {number_text(option.lead)} s{killwait}{shell}"
        fixed = wait or 0.0
        found.append(Window(Kind.SLURM_SIGNAL, option.name, option.lead + fixed, origin, fixed=fixed))
    return found


def save_seconds(checkpoint_bytes: int, bytes_per_second: float, overhead: float = SAVE_OVERHEAD) -> float:
    """Seconds from the start of a save until durable, at a measured write speed (100 MiB, 106 MiB/s: 1.4)."""
    if bytes_per_second <= 0:
        raise ValueError(f"bytes_per_second must be > 0, got {bytes_per_second!r}.")
    return checkpoint_bytes / bytes_per_second * overhead


def fits(need_seconds: float, window_seconds: float, share: float = FIT_SHARE) -> bool:
    """Whether a save of ``need_seconds`` fits in ``share`` of a window of ``window_seconds``."""
    return need_seconds <= share * window_seconds


def largest_fitting_bytes(
    window_seconds: float, bytes_per_second: float, overhead: float = SAVE_OVERHEAD, share: float = FIT_SHARE
) -> float:
    """The largest checkpoint whose save :func:`fits` in the window at that write speed."""
    return share * window_seconds * bytes_per_second / overhead


def torchrun_kills(environ: Mapping[str, str], option: SlurmSignal) -> bool:
    """Whether SLURM's ``--signal`` reaches a torchrun agent that does not forward it, and so kills it."""
    # B: sends it to the batch shell only, which torchrun under srun never sees.
    if option.batch_only or not environ.get(ENV["elastic_run"]):
        return False
    return option.name not in torchrun_forwards(environ)


def advice(window: Window, need_seconds: float) -> str:
    """What to change so that a save of ``need_seconds`` fits in ``window``, with the numbers."""
    enough = math.ceil(need_seconds / FIT_SHARE)
    lead = max(math.ceil(need_seconds / FIT_SHARE - window.fixed), 1)
    variable = ENV["grace_seconds"]
    if window.kind is Kind.EXPLICIT:
        change = f"give the job at least {enough} s from its stop signal to SIGKILL (and set ${variable})"
    elif window.kind is Kind.SLURM_KILL_WAIT:
        early = max(enough - math.floor(window.seconds), SLURM_DEFAULT_LEAD_SECONDS)
        change = (
            f"KillWait is the cluster's: ask for an early signal that PreemptionHandler saves on, e.g. "
            f"#SBATCH --signal=USR1@{early}"
        )
    elif window.kind is Kind.SLURM_PREEMPTION:
        change = "GraceTime is the partition's: ask the admins for more, or use another partition"
    elif window.kind is Kind.SLURM_SIGNAL:
        change = f"raise the --signal lead to at least {lead} s (--signal=...@{lead})"
    elif window.kind is Kind.TORCHRUN:
        change = f"torchrun --shutdown-timeout {enough} (or ${ENV['elastic_shutdown']}={enough})"
    else:
        change = (
            f"terminationGracePeriodSeconds: {enough} in the pod spec, and ${variable}={enough} in its env"
        )
    return (
        f"{change}; or write to faster storage, or bound what a lost save costs with "
        "RequeueCheckpoint(every_n_minutes=...)"
    )
