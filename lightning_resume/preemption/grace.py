"""The grace window: how long a scheduler waits between its stop signal and SIGKILL, and whether a save fits.

Plain functions over the environment and the text of scheduler commands, so that ``doctor`` and its
tests need no scheduler. The sources, checked with Slurm 22.05 and torch 2.13:

- SLURM: ``scontrol show config`` gives ``KillWait`` (SIGTERM -> SIGKILL: ``scancel``, ``scontrol
  requeue``, the time limit). On preemption the partition's ``GraceTime`` (``scontrol show partition``)
  comes on top. The job's ``--signal=[R|B:]SIG[@LEAD]`` is neither in ``scontrol show job`` nor in the
  job's environment: it is read from ``sacct``'s ``SubmitLine``, ``$SBATCH_SIGNAL`` and the
  ``#SBATCH`` lines of the batch script, in sbatch's order of precedence. Without ``@LEAD`` the lead
  is 60 s.
- torchrun: ``$PET_SHUTDOWN_TIMEOUT`` (the environment form of ``--shutdown-timeout``), then
  ``$TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, default 30 s, between forwarding the signal to the workers and
  SIGKILL. The agent forwards only the signals in ``$TORCHELASTIC_SIGNALS_TO_HANDLE`` (default
  SIGTERM,SIGINT,SIGHUP,SIGQUIT); any other one, such as SLURM's SIGUSR1, kills the agent.
- Kubernetes: ``terminationGracePeriodSeconds`` (default 30 s) is not visible inside the pod.

``$LIGHTNING_RESUME_GRACE_SECONDS`` states the window explicitly and wins over all of them.
"""

from __future__ import annotations

import enum
import math
import re
import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from lightning_resume._scheduler.environment import ENV

#: torchrun's shutdown timeout when neither variable sets it.
TORCHRUN_DEFAULT_SECONDS = 30
#: Kubernetes' default ``terminationGracePeriodSeconds``.
KUBERNETES_DEFAULT_SECONDS = 30
#: SLURM's lead for ``--signal=SIG`` without ``@LEAD``.
SLURM_DEFAULT_LEAD_SECONDS = 60
#: torchrun's default ``--signals-to-handle``.
TORCHRUN_DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
#: A save is more than its write: ``torch.save`` pickles the state and copies tensors off the GPU first.
#: A rough allowance on top of the measured write time, not a measurement.
SAVE_OVERHEAD = 1.5
#: The share of a window a save may take: the signal arrives mid-step, the step has to end before the
#: save starts, and the process has to exit after it.
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
    """The seconds between a stop signal and SIGKILL.

    Attributes:
        kind: The scheduler rule it comes from.
        signal: The first signal of the window (``SIGTERM``, ``SIGUSR1``, ...).
        seconds: From that signal to SIGKILL.
        origin: Where the number comes from, for the report.
        fixed: The part of ``seconds`` the job cannot change (the cluster's ``KillWait`` under a
            ``--signal`` lead).
    """

    kind: Kind
    signal: str
    seconds: float
    origin: str
    fixed: float = 0.0

    @property
    def label(self) -> str:
        """``slurm SIGUSR1``, ``slurm preemption``, ``torchrun SIGTERM``, ..."""
        if self.kind is Kind.SLURM_PREEMPTION:
            return self.kind.value
        return f"{self.kind.value.split()[0]} {self.signal}"


@dataclass(frozen=True)
class SlurmSignal:
    """A job's ``--signal=[R|B:]SIG[@LEAD]``.

    Attributes:
        name: The signal, e.g. ``SIGUSR1``.
        lead: Seconds before the end of the job that SLURM sends it.
        batch_only: ``B:``: only the batch shell gets it, not the job steps.
    """

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
    """The partition's ``GraceTime`` in seconds, or ``None`` when its jobs are not preempted.

    Args:
        show_partition: The output of ``scontrol show partition NAME`` (``GraceTime=10``,
            ``PreemptMode=REQUEUE``).
    """
    fields = dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", show_partition))
    if fields.get("PreemptMode", "OFF").upper() == "OFF":
        return None
    grace = fields.get("GraceTime", "")
    return float(grace) if grace.isdigit() else None


def parse_signal_spec(spec: str) -> SlurmSignal:
    """``B:USR1@90`` -> ``SlurmSignal("SIGUSR1", 90, batch_only=True)``: the value of ``--signal``.

    Raises:
        ValueError: not of the form ``[R|B:]SIG[@LEAD]``.
    """
    match = re.fullmatch(r"(?:([RB]{1,2}):)?(\w+)(?:@(\d+))?", spec.strip())
    if not match:
        raise ValueError(f"{spec!r} is not a SLURM signal spec of the form [R|B:]SIG[@LEAD], e.g. B:USR1@90.")
    flags, sig, lead = match.groups()
    try:
        name = signal.Signals(int(sig)).name if sig.isdigit() else signal.Signals[_full_name(sig)].name
    except (KeyError, ValueError):
        raise ValueError(f"{spec!r}: {sig!r} is not a signal.") from None
    return SlurmSignal(name, float(lead) if lead else SLURM_DEFAULT_LEAD_SECONDS, "B" in (flags or ""))


def _full_name(sig: str) -> str:
    sig = sig.upper()
    return sig if sig.startswith("SIG") else f"SIG{sig}"


def _words(line: str) -> list[str]:
    # sacct prints the submit line without the shell's quotes (``--wrap=sleep 2``): quotes may not pair.
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
        try:
            found = parse_signal_spec(spec)
        except ValueError:
            continue
    return found


def submit_line_signal(submit_line: str) -> SlurmSignal | None:
    """``--signal`` from ``sacct -o SubmitLine`` (``sbatch --signal=B:USR1@90 job.sh``)."""
    return _signal_option(_words(submit_line))


def batch_script_signal(batch_script: str) -> SlurmSignal | None:
    """``--signal`` from the ``#SBATCH`` lines of a batch script (``scontrol write batch_script ID -``).

    Like sbatch, reads ``#SBATCH`` lines only until the first command, and a later one overrides.
    """
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
    """The job's ``--signal``: the command line wins over ``$SBATCH_SIGNAL``, which wins over the script.

    Raises:
        ValueError: ``$SBATCH_SIGNAL`` is set to something sbatch would refuse.
    """
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
    """torchrun's seconds from forwarding a signal to SIGKILL and where they come from, under torchrun.

    ``torchrun --shutdown-timeout N`` on the command line is not visible to the workers; its environment
    forms are.

    Raises:
        ValueError: a variable torchrun reads is not a whole number >= 0.
    """
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
    return tuple(_full_name(name.strip()) for name in names.split(",") if name.strip())


def windows(
    environ: Mapping[str, str],
    show_config: str | None = None,
    show_partition: str | None = None,
    submit_line: str | None = None,
    batch_script: str | None = None,
) -> list[Window]:
    """Every stop-signal-to-SIGKILL window that applies to this process.

    Args:
        environ: The environment (the scheduler's variables and the explicit override).
        show_config: ``scontrol show config`` (SLURM windows need it).
        show_partition: ``scontrol show partition $SLURM_JOB_PARTITION`` (the preemption window).
        submit_line: ``sacct -X -j ID -o SubmitLine -P -n`` (the job's ``--signal``).
        batch_script: ``scontrol write batch_script ID -`` (``#SBATCH --signal``).

    Returns:
        The windows found; only the explicit one when ``$LIGHTNING_RESUME_GRACE_SECONDS`` is set.

    Raises:
        ValueError: a variable holds a value that is not what it should be; the message names it.

    Example::

        windows({"TORCHELASTIC_RUN_ID": "x"})  # [Window(Kind.TORCHRUN, "SIGTERM", 30, ...)]
    """
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
        found.append(
            Window(
                Kind.KUBERNETES,
                "SIGTERM",
                KUBERNETES_DEFAULT_SECONDS,
                f"assumed: terminationGracePeriodSeconds' default, not visible in the pod; ${variable} "
                "states the real one",
            )
        )
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
        lead = f"--signal lead {number_text(option.lead)} s"
        if wait is None:
            origin = f"{lead}, KillWait unknown{shell}"
            found.append(Window(Kind.SLURM_SIGNAL, option.name, option.lead, origin))
        else:
            origin = f"{lead} + KillWait{shell}"
            found.append(Window(Kind.SLURM_SIGNAL, option.name, option.lead + wait, origin, fixed=wait))
    return found


def save_seconds(checkpoint_bytes: int, bytes_per_second: float, overhead: float = SAVE_OVERHEAD) -> float:
    """Estimated seconds from the start of a save until the checkpoint is durable.

    Args:
        checkpoint_bytes: The size of the checkpoint (the newest one is the best guess of the next).
        bytes_per_second: The measured durable write speed of its directory.
        overhead: The factor for serialising on top of the write (:data:`SAVE_OVERHEAD`).

    Example::

        save_seconds(100 << 20, 106 << 20)  # ~1.4
    """
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
    """Whether SLURM's ``--signal`` reaches a torchrun agent that does not forward it, and so kills it.

    ``B:`` sends it to the batch shell only, which torchrun under ``srun`` never sees.
    """
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
