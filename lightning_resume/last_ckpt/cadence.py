"""The checkpoint interval of ``RequeueCheckpoint(every_n_train_steps="auto")``: Young/Daly, bounded. Pure.

An interruption that loses work costs, on average, half an interval of training; a save costs its
stall on the training thread. Young's first-order optimum of the sum is

    interval = sqrt(2 x save stall x mean time between interruptions)

and Daly's higher-order one (Daly 2006), used here, is, with ``d`` the save stall and ``M`` the mean
time between interruptions,

    interval = sqrt(2dM) x (1 + sqrt(d / 2M) / 3 + d / 18M) - d     for d < 2M, else M

(:func:`daly`; for a save far cheaper than ``M`` the two agree). Here:

- the **save stall** is the time ``RequeueCheckpoint.save`` holds the training thread (the slowest
  rank's mean over its recent saves after the attempt's first, pooled with the earlier attempts'
  until there are enough: the expected cost of a save, long ones included; :func:`save_cost`), not
  the background write;
- the **mean time between interruptions** comes from the run's own attempt history
  (:func:`interruptions`: the seconds its attempts ran, this one so far included, over the number of
  its interruptions) as soon as it holds one; before that, from a :class:`Prior`: the user's
  ``expected_interruption_every``, else the shortest of the SLURM time limit, an assumed
  :data:`CLOUD_SECONDS` on a cloud virtual machine (possibly spot or preemptible) and
  :data:`DEFAULT_SECONDS`. The user's value also stays in the history's estimate, as one more
  interruption (:func:`time_between_interruptions`);
- **every interruption counts** (preempted by a signal or a notice, killed, hung, failed), whether or
  not a save at the signal made it lose nothing: a graceful preemption is evidence of the preemption
  rate, and the next one may come without grace (a SIGKILL, a node lost, a grace window too short for
  the save). Erring short is cheap (one more save costs its stall, a fraction of a second), erring
  long is not (an interruption without a save loses up to a whole interval): counting only the
  interruptions that lost work made a run whose saves at SIGTERM succeeded look calm and stretch its
  interval until the next SIGKILL lost it. :func:`lost_work` still tells which ones lost work;
- the interval is at least the measured **time to durable** (a save is never started while the
  previous one is still being written) and one step, and at most the mean time between
  interruptions; it is converted to steps with the measured **step time**;
- a new interval replaces the current one only when it differs by more than :data:`HYSTERESIS`
  (:func:`material`), so that noise in the measurements does not move it at every save.

Pure standard library; the callback gathers the measurements and the facts (``last_ckpt/cadence.py``).

At run time (:class:`Cadence`), every rank times its own saves and steps; rank 0 records them in the
attempt history, decides the interval from the slowest rank's stalls (one small all-reduce) and
broadcasts it after each save, so that every rank saves at the same steps. A restart starts from the
figures its history recorded (:func:`recorded_stalls`, :func:`last_measured`, :func:`last_cadence`).
"""

from __future__ import annotations

import collections
import enum
import logging
import math
import os
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_resume._checks import is_number, positive_number, whole_number
from lightning_resume._scheduler.environment import ENV, on_slurm
from lightning_resume._scheduler.machine import on_aws, on_azure, on_gce, read_machine
from lightning_resume._scheduler.slurm import slurm_output
from lightning_resume.io._protocol import ReportsWrites
from lightning_resume.run_dir import attempts
from lightning_resume.run_dir.attempts import INTERRUPTIONS, Attempt, Cause, History, LastCkptSaves, Stalls

if TYPE_CHECKING:  # the rules above are read by the command line, which imports neither
    import lightning.pytorch as pl

    from lightning_resume.run_dir.run_dir import RunDir

#: The mean time between interruptions assumed when nothing else is known: a day.
DEFAULT_SECONDS = 24 * 3600.0
#: The mean time between interruptions assumed on a cloud virtual machine (it may be spot or
#: preemptible, which the firmware strings do not tell): six hours.
CLOUD_SECONDS = 6 * 3600.0
#: The interval while a run has no save after an attempt's first measured yet: the first save of an
#: attempt pays one-time costs, the second tells what a save costs.
FIRST_SAVE_STEPS = 10
#: Saves after an attempt's first whose mean stall is the cost of a save (:func:`save_cost`).
SAVE_WINDOW = 16
#: A new interval replaces the current one only when it is this many times longer or shorter.
HYSTERESIS = 1.25


class PriorSource(str, enum.Enum):
    """Where the expected time between interruptions comes from before the history has any."""

    USER = "user"
    SLURM_TIME_LIMIT = "slurm time limit"
    CLOUD = "cloud"
    DEFAULT = "default"


@dataclass(frozen=True)
class Prior:
    """The expected time between interruptions before the run has seen one.

    Attributes:
        seconds: The expected time.
        source: Where it comes from.
        detail: For people (``"RequeueCheckpoint(expected_interruption_every=3600 s)"``).
    """

    seconds: float
    source: PriorSource
    detail: str


def prior(
    user_seconds: float | None = None,
    time_limit_seconds: float | None = None,
    cloud: str | None = None,
) -> Prior:
    """The prior: the user's value, else the shortest of the scheduler's and machine's, else a day.

    Args:
        user_seconds: ``RequeueCheckpoint(expected_interruption_every=...)`` in seconds.
        time_limit_seconds: The SLURM job's time limit (the job ends, and is requeued, that often).
        cloud: The cloud this machine is a virtual machine of (``"aws"``, ``"gce"``, ``"azure"``).
    """
    if user_seconds is not None:
        return Prior(user_seconds, PriorSource.USER, f"expected_interruption_every={duration(user_seconds)}")
    found = [Prior(DEFAULT_SECONDS, PriorSource.DEFAULT, f"assumed {duration(DEFAULT_SECONDS)}")]
    if cloud is not None:
        detail = f"a {cloud} virtual machine (may be spot): assumed {duration(CLOUD_SECONDS)}"
        found.append(Prior(CLOUD_SECONDS, PriorSource.CLOUD, detail))
    if time_limit_seconds is not None and time_limit_seconds > 0:
        detail = f"the SLURM time limit, {duration(time_limit_seconds)}"
        found.append(Prior(time_limit_seconds, PriorSource.SLURM_TIME_LIMIT, detail))
    return min(found, key=lambda p: p.seconds)


def parse_time_limit(text: str) -> float | None:
    """``TimeLimit=`` of ``scontrol -o show job`` in seconds (``None``: ``UNLIMITED`` or absent).

    SLURM writes ``[days-]hours:minutes:seconds`` (``2-00:00:00``, ``01:30:00``, ``30:00``).
    """
    found = re.search(r"(?:^|\s)TimeLimit=(\S+)", text)
    if found is None:
        return None
    value = found.group(1)
    days, _, clock = value.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3 or (days and not days.isdigit()):
        return None  # UNLIMITED, Partition_Limit, NONE
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    if len(parts) == 1:
        seconds *= 60  # minutes alone
    return float(seconds + int(days or 0) * 86400)


def slurm_time_limit(environ: Mapping[str, str], scontrol_show_job: str | None = None) -> float | None:
    """The SLURM job's time limit in seconds: ``$SLURM_JOB_END_TIME - $SLURM_JOB_START_TIME`` (SLURM
    23.02 and later), else ``TimeLimit=`` in ``scontrol -o show job`` output; ``None`` when unknown."""
    try:
        start = int(environ.get("SLURM_JOB_START_TIME", "").strip())
        end = int(environ.get("SLURM_JOB_END_TIME", "").strip())
    except ValueError:
        start = end = 0
    if start > 0 and end > start:
        return float(end - start)
    return parse_time_limit(scontrol_show_job) if scontrol_show_job else None


# -- the run's own history ---------------------------------------------------------------------------


def interrupted(attempt: Attempt) -> bool:
    """Whether an attempt ended by an interruption (preempted, killed, hung, failed), lossy or not."""
    return attempt.end is not None and attempt.end.cause in INTERRUPTIONS


def lost_work(attempt: Attempt) -> bool:
    """Whether an attempt ended by an interruption that lost the work since its last durable save.

    ``killed`` always counts (nothing says when it died); ``preempted``, ``failed`` and ``hung`` count
    unless the newest durable checkpoint holds the last step it reached (a preemption whose save at the
    signal or notice was durable lost nothing). The interval counts every interruption
    (:func:`interrupted`); this one tells the people reading the choice how many cost work.
    """
    end = attempt.end
    if end is None or end.cause not in INTERRUPTIONS:
        return False
    if end.cause is Cause.KILLED:
        return True
    if attempt.last_step is None:
        return False  # ended before training: no work to lose
    return attempt.checkpoint is None or attempt.checkpoint.step < attempt.last_step


@dataclass(frozen=True)
class Interruptions:
    """What the run's history says about its interruptions.

    Attributes:
        seconds: How long its attempts ran (start to end; the running one until now).
        count: Interruptions (:func:`interrupted`), lossy or not; the summed-up earlier attempts count
            theirs.
        attempts: Attempts counted.
        lost_work: Those of ``count`` that lost work (:func:`lost_work`; the summed-up earlier
            attempts do not say, and count as none).
        unrecorded: Those of ``count`` (and ``attempts``) that were launches killed while starting,
            which left no record (``Attempt.unrecorded_launches``).
    """

    seconds: float
    count: int
    attempts: int
    lost_work: int = 0
    unrecorded: int = 0


def interruptions(history: History, now: float) -> Interruptions:
    """The run's exposure and interruptions; an open record counts as running until ``now``.

    Only the last attempt may be open (the running one); earlier open records are closed by the
    next attempt's start (``attempts.begin``).
    """
    seconds, count, lossy = history.earlier.seconds, history.earlier.interruptions, 0
    unrecorded = 0
    for attempt in history.attempts:
        end = attempt.end.time if attempt.end is not None else now
        seconds += max(end - attempt.started, 0.0)
        count += interrupted(attempt)
        lossy += lost_work(attempt)
        # Launches killed while starting, seen as gaps in the scheduler's restart count: interruptions
        # whose seconds are unknown (short: they never reached RunDir) and count as none.
        unrecorded += attempt.unrecorded_launches
    attempts = history.earlier.attempts + len(history.attempts) + unrecorded
    return Interruptions(seconds, count + unrecorded, attempts, lossy, unrecorded)


@dataclass(frozen=True)
class Between:
    """The expected time between interruptions and where it comes from.

    Attributes:
        seconds: The expected time.
        source: ``"history"`` or the prior's source.
        detail: For people.
    """

    seconds: float
    source: str
    detail: str


def time_between_interruptions(seen: Interruptions, before: Prior) -> Between:
    """From the history once it holds an interruption (its seconds over their number); else the prior.

    The user's ``expected_interruption_every`` stays in the estimate as one more interruption after
    that many seconds (the mean of a gamma posterior whose prior is worth one interruption): the first
    few lifetimes of a run are as noisy as single draws, and a user who knows the rate should not see
    the interval swing with each. A history that disagrees outweighs it as interruptions accumulate
    (after ``n`` of them it counts for ``1 / (n + 1)``). The other priors are assumptions or bounds
    (a day, a cloud's six hours, the time limit), not estimates of the rate: the history replaces them.

    Without any interruption yet, the run has gone ``seen.seconds`` without one: the expected time is
    at least that, and the prior when longer.
    """
    if seen.count:
        starting = f", {seen.unrecorded} killed while starting" if seen.unrecorded else ""
        detail = (
            f"{seen.count} interruption(s) in {duration(seen.seconds)} of this run "
            f"({seen.lost_work} lost work{starting})"
        )
        if before.source is PriorSource.USER:
            detail += f", and {before.detail} counted as one more"
            return Between(
                (seen.seconds + before.seconds) / (seen.count + 1), "history", f"the history: {detail}"
            )
        return Between(seen.seconds / seen.count, "history", f"the history: {detail}")
    if seen.seconds > before.seconds:
        detail = (
            f"no interruption in {duration(seen.seconds)} of this run, more than the prior {before.detail}"
        )
        return Between(seen.seconds, "history", f"the history: {detail}")
    return Between(before.seconds, before.source.value, f"the prior: {before.detail}")


# -- the interval -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurements:
    """What the interval is computed from, measured in this run.

    Attributes:
        save_stall: Seconds a save of ``last.ckpt`` holds the training thread (:func:`save_cost`:
            the mean of recent saves after the attempt's first, the slowest rank's).
        to_durable: Seconds from the start of a save until it is durable (``save_stall`` or more).
        step_seconds: Seconds per optimizer step (saves left out).
    """

    save_stall: float
    to_durable: float
    step_seconds: float


class Bound(str, enum.Enum):
    """What limited the interval, if anything."""

    TO_DURABLE = "time to durable"
    BETWEEN = "time between interruptions"
    ONE_STEP = "one step"


@dataclass(frozen=True)
class Choice:
    """An interval chosen by :func:`choose`, with its inputs (for the log, the history and ``doctor``).

    Attributes:
        steps: Save every this many optimizer steps.
        seconds: The interval in seconds (``steps`` x the step time).
        young_daly: Daly's optimum (:func:`daly`) for the save stall and the time between
            interruptions, before the bounds (the name predates the higher-order form).
        bound: What limited it (``None``: Young/Daly's value).
        save_stall, to_durable, step_seconds: The measurements.
        between: The expected time between interruptions.
        between_source: Where it comes from (``"history"``, or the prior's source).
        between_detail: For people.
    """

    steps: int
    seconds: float
    young_daly: float
    bound: Bound | None
    save_stall: float
    to_durable: float
    step_seconds: float
    between: float
    between_source: str
    between_detail: str

    def describe(self) -> str:
        """One line: the interval, and why."""
        why = (
            f"sqrt(2 x {duration(self.save_stall)} save stall x {duration(self.between)} between "
            f"interruptions), Daly's higher-order form = {duration(self.young_daly)}"
        )
        if self.bound is Bound.TO_DURABLE:
            why += f", raised to the {duration(self.to_durable)} a save takes to be durable"
        elif self.bound is Bound.BETWEEN:
            why += ", the time between interruptions (a save that costly: once per interruption)"
        elif self.bound is Bound.ONE_STEP:
            why += ", raised to one step"
        return (
            f"every {self.steps} steps (~{duration(self.seconds)} at {duration(self.step_seconds)} a step): "
            f"{why}; time between interruptions from {self.between_detail}"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bound"] = self.bound.value if self.bound is not None else None
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in data.items()}


def mean_stall(stalls: Sequence[float]) -> float | None:
    """The mean of save stalls, long ones included (``None`` for none).

    The mean, not the median: saves of one checkpoint are often bimodal, or now and then much longer
    (the page cache's write-back throttling the writer), and the interval trades their total cost.

    Example::

        >>> mean_stall([0.2, 0.2, 0.2, 1.0])  # the median would say 0.2
        0.4
    """
    return math.fsum(stalls) / len(stalls) if stalls else None


def save_cost(later: Stalls, recorded: Stalls, enough: int = SAVE_WINDOW) -> float | None:
    """The cost of a save to put in the interval: the mean stall of saves after an attempt's first
    (``None`` until one is measured: the run is still measuring).

    ``later``, this attempt's recent ones, alone once there are ``enough``; before that pooled with
    ``recorded``, those of the newest earlier attempts (``attempts.recorded_stalls``).

    The first save of an attempt is left out: it pays one-time costs (the first large allocations,
    the writer's start: 1.4 s against 0.2 to 0.5 s for the others of a 128 MB synchronous save),
    which every attempt pays once whatever the interval. Priced at it, a save looked three to five
    times as costly and the interval came out twice as long. Pooled, because at a high interruption
    rate an attempt makes one or two saves: the newest attempt alone often has no later save to tell.

    Example::

        >>> save_cost(Stalls(0.5, 1), recorded=Stalls(1.0, 2))  # (0.5 + 1.0) / 3
        0.5
        >>> save_cost(Stalls(), Stalls()) is None  # only first saves so far: measure a second one
        True
    """
    pooled = later if later.count >= enough else later + recorded
    return pooled.mean


def daly(save_stall: float, between: float) -> float:
    """Daly's higher-order optimum: ``sqrt(2dM) x (1 + sqrt(d/2M)/3 + d/18M) - d`` for ``d < 2M``, else ``M``.

    ``d`` is the save stall, ``M`` the mean time between interruptions (Daly 2006, "A higher order
    estimate of the optimum checkpoint interval for restart dumps"). Below ``d = 2M`` it equals
    ``2M x (1 - x/3)^2 x x`` with ``x = sqrt(d/2M)``: positive, and shorter than Young's by about
    two thirds of ``d``.

    Example::

        >>> round(daly(2.0, 3600.0), 2)  # Young's: 120.0
        118.67
    """
    d, m = max(save_stall, 0.0), max(between, 0.0)
    if d >= 2.0 * m:
        return m
    return math.sqrt(2.0 * d * m) * (1.0 + math.sqrt(d / (2.0 * m)) / 3.0 + d / (18.0 * m)) - d


def choose(measured: Measurements, between: Between) -> Choice:
    """The interval for these measurements: Daly's optimum, then the bounds, in steps."""
    ideal = daly(measured.save_stall, between.seconds)
    seconds, bound = ideal, None
    if measured.save_stall >= 2.0 * between.seconds:
        bound = Bound.BETWEEN  # Daly: a save that costly, once per interruption
    if seconds < measured.to_durable:
        seconds, bound = measured.to_durable, Bound.TO_DURABLE  # never two saves in flight back to back
    step = max(measured.step_seconds, 1e-9)
    steps = max(1, math.ceil(seconds / step - 1e-9))
    if seconds < step:
        bound = Bound.ONE_STEP
    return Choice(
        steps=steps,
        seconds=steps * measured.step_seconds,
        young_daly=ideal,
        bound=bound,
        save_stall=measured.save_stall,
        to_durable=measured.to_durable,
        step_seconds=measured.step_seconds,
        between=between.seconds,
        between_source=between.source,
        between_detail=between.detail,
    )


def material(current: int | None, proposed: int, factor: float = HYSTERESIS) -> bool:
    """Whether ``proposed`` steps should replace ``current`` (none yet, or beyond ``factor`` either way)."""
    return current is None or proposed > current * factor or proposed * factor < current


def duration(seconds: float) -> str:
    """``0.25 s``, ``42 s``, ``3.5 min``, ``2.1 h``, ``1.5 d``."""
    if seconds < 10:
        return f"{seconds:.3g} s"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 1.5 * size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def choice_from_dict(data: Mapping[str, Any]) -> Choice | None:
    """The :class:`Choice` recorded in an attempt's ``cadence`` (``None`` when it is not one)."""
    try:
        bound = data.get("bound")
        return Choice(
            steps=int(data["steps"]),
            seconds=float(data["seconds"]),
            young_daly=float(data["young_daly"]),
            bound=Bound(bound) if bound is not None else None,
            save_stall=float(data["save_stall"]),
            to_durable=float(data["to_durable"]),
            step_seconds=float(data["step_seconds"]),
            between=float(data["between"]),
            between_source=str(data["between_source"]),
            between_detail=str(data["between_detail"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


# -- what a restart starts from: the run's recorded figures ---------------------------------------------


def last_measured(history: History) -> LastCkptSaves | None:
    """The ``last.ckpt`` save times of the newest attempt that saved one (what a restart starts from)."""
    for attempt in reversed(history.attempts):
        if attempt.last_ckpt_saves.count:
            return attempt.last_ckpt_saves
    return None


def recorded_stalls(history: History, enough: int) -> Stalls:
    """The stalls of the saves after each attempt's first, pooled over the newest attempts until
    ``enough`` (or the whole history): what a restart prices a save at.

    At a high interruption rate most attempts make one or two saves, and the newest attempt alone
    would often say nothing but its first save, which pays one-time costs.
    """
    pooled = Stalls()
    for attempt in reversed(history.attempts):
        if pooled.count >= enough:
            break
        pooled += attempt.last_ckpt_saves.later
    return pooled


def last_cadence(history: History) -> dict[str, Any] | None:
    """The interval ``every_n_train_steps="auto"`` chose last in the run, if any."""
    return next((a.cadence for a in reversed(history.attempts) if a.cadence is not None), None)


def recorded_to_durable(run_dir: Path) -> float | None:
    """The longest time to durable of the newest attempt of ``run_dir`` that measured one (or ``None``)."""
    measured = last_measured(attempts.read(run_dir))
    return measured.max_to_durable if measured is not None and measured.durable_count else None


# -- the callback's side: measure, decide, broadcast -----------------------------------------------------


log = logging.getLogger(__name__)

AUTO = "auto"
#: Batches timed before the first decision (a restart decides from its recorded save times then).
FIRST_DECISION_BATCHES = 5
#: Recent saves (times to durable) and steps whose median is used (a validation does not move it).
WINDOW = 5
STEP_WINDOW = 32


def checked_interval(value: Any) -> int | str | None:
    """``every_n_train_steps``: a whole number >= 1, ``"auto"`` or ``None``.

    Raises:
        TypeError: a string other than ``"auto"``, or not a whole number.
        ValueError: a number below 1.
    """
    if value is None or value == AUTO:
        return value
    if isinstance(value, str):  # "5" stays a wrong type, as before "auto" existed
        raise TypeError(
            f"every_n_train_steps must be a whole number of steps, 'auto' or None, got {value!r}."
        )
    return whole_number("every_n_train_steps", value, 1, "whole number of steps, 'auto' or None")


def checked_seconds(value: Any) -> float | None:
    """``expected_interruption_every`` in seconds: a ``timedelta``, a number of seconds or ``None``.

    Raises:
        TypeError: neither.
        ValueError: not positive.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    elif not is_number(value):
        raise TypeError(
            f"expected_interruption_every must be a timedelta, a number of seconds or None, got {value!r}."
        )
    return positive_number("expected_interruption_every", value, "timedelta or number of seconds")


def _micro(seconds: float | None) -> int:
    """Seconds as whole microseconds for an all-reduce (-1: none measured)."""
    return round(seconds * 1e6) if seconds is not None else -1


def _seconds(micro: int) -> float | None:
    return micro / 1e6 if micro >= 0 else None


def _cloud() -> str | None:
    machine = read_machine()
    for name, test in (("aws", on_aws), ("gce", on_gce), ("azure", on_azure)):
        if test(machine):
            return name
    return None


def _time_limit() -> float | None:
    if not on_slurm(os.environ):
        return None
    found = slurm_time_limit(os.environ)
    if found is not None:
        return found
    text = slurm_output(["scontrol", "-o", "show", "job", os.environ[ENV["slurm_job"]]])
    return slurm_time_limit(os.environ, text)


@dataclass(frozen=True)
class _Recorded:
    """What a restart starts from: the history's figures (rank 0).

    Attributes:
        stalls: The stalls after each attempt's first save, of the newest attempts.
        to_durable: The newest time to durable of the newest attempt that saved.
        step: The step time the interval was last chosen with.
    """

    stalls: Stalls = field(default_factory=Stalls)
    to_durable: float | None = None
    step: float | None = None


class Cadence:
    """Times ``RequeueCheckpoint``'s saves (every rank) and chooses the ``"auto"`` interval (rank 0).

    Args:
        every_n_train_steps: The callback's argument (checked): a number, ``"auto"`` or ``None``.
        expected_interruption_every: The user's prior, in seconds (checked), or ``None``.
    """

    def __init__(
        self, every_n_train_steps: int | str | None, expected_interruption_every: float | None
    ) -> None:
        self.fixed = every_n_train_steps if isinstance(every_n_train_steps, int) else None
        self.auto = every_n_train_steps == AUTO
        self.expected_seconds = expected_interruption_every
        self.steps: int | None = None  # the interval every rank uses ("auto")
        self.choice: Choice | None = None
        self._run_dir: RunDir | None = None
        self._prior: Prior | None = None
        self._recorded = _Recorded()
        self._reset()

    def _reset(self) -> None:
        self._start_step = 0
        self._batches = 0  # counted alike on every rank: decisions (collectives) are taken at the same one
        self._pending = True  # a decision is due: at the start, and after each save
        self._saved = False  # this attempt's first save is done (it pays one-time costs: left out)
        # the saves after the first
        self._stalls: collections.deque[float] = collections.deque(maxlen=SAVE_WINDOW)
        self._durables: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self._step_times: collections.deque[float] = collections.deque(maxlen=STEP_WINDOW)
        self._last: tuple[int, float] | None = None  # the last optimizer step seen and when
        self._stalled = 0.0  # save stall since then (left out of the step time)
        self._save: tuple[float, object] | None = None  # the save in progress: start, the last write
        self._source: ReportsWrites | None = None  # what says when the newest save is durable
        self._writing: tuple[float, object] | None = None  # a background write: its save's stall, last write

    # -- every rank ------------------------------------------------------------------------------

    def start(self, trainer: pl.Trainer, run_dir: RunDir) -> None:
        """At the start of training: the run's recorded figures and the prior (rank 0)."""
        self._reset()
        self._run_dir, self._start_step = run_dir, trainer.global_step
        if self.auto and self.steps is None:
            self.steps = FIRST_SAVE_STEPS
        if not trainer.is_global_zero:
            return
        history = run_dir.attempts.history
        measured, chosen = last_measured(history), last_cadence(history)
        self._recorded = _Recorded(
            recorded_stalls(history, SAVE_WINDOW),
            measured.last_to_durable if measured is not None else None,
            float(chosen["step_seconds"]) if chosen and chosen.get("step_seconds") else None,
        )
        if self.auto and self._prior is None:
            self._prior = prior(self.expected_seconds, _time_limit(), _cloud())

    def saving(self, trainer: pl.Trainer, writer: object = None) -> None:
        """A save of ``last.ckpt`` begins; ``writer`` writes it where the checkpoint plugin does not
        (the sharded saver). The plugin or the writer, when it says when a save is durable
        (:class:`ReportsWrites`), times a write that goes on in the background."""
        source = writer if writer is not None else trainer.strategy.checkpoint_io
        self._source = source if isinstance(source, ReportsWrites) else None
        self._save = (time.monotonic(), self._source.last_write if self._source is not None else None)

    def saved(self, trainer: pl.Trainer) -> None:
        """The save returned: its stall is timed; its time to durable now, or when its write is done."""
        if self._save is None:
            return
        started, write_before = self._save
        self._save = None
        stall = time.monotonic() - started
        if not self._saved:
            self._saved = True
        else:
            self._stalls.append(stall)
        self._stalled += stall
        self._pending = True
        background = self._source is not None and self._source.last_write is write_before
        if background:
            self._writing = (stall, write_before)  # committed later, by the plugin's writer
        else:
            self._durables.append(stall)  # written (and fsynced) before save returned
        self._record(trainer, stall=stall, to_durable=None if background else stall)

    def due(self, trainer: pl.Trainer, last_save_step: int) -> bool:
        """After a training batch with a new optimizer step (every rank): whether a save is due now."""
        self._time_step(trainer)
        self._check_write(trainer)
        if self.fixed is not None:
            return trainer.global_step % self.fixed == 0
        if not self.auto:
            return False
        self._batches += 1
        if self._pending and self._batches >= FIRST_DECISION_BATCHES:
            self._pending = False
            self._decide(trainer)
        base = max(last_save_step, self._start_step)
        return self.steps is not None and trainer.global_step - base >= self.steps

    def _time_step(self, trainer: pl.Trainer) -> None:
        now, step = time.monotonic(), trainer.global_step
        if self._last is not None and step > self._last[0]:
            seconds = max(now - self._last[1] - self._stalled, 0.0)
            self._step_times.append(seconds / (step - self._last[0]))
        self._last, self._stalled = (step, now), 0.0

    def _check_write(self, trainer: pl.Trainer) -> None:
        """A background write of the newest save is done: its time to durable is the stall plus the write."""
        if self._writing is None:
            return
        write = self._source.last_write if self._source is not None else None
        stall, before = self._writing
        if write is None or write is before:
            return
        self._writing = None
        to_durable = stall + write.seconds
        self._durables.append(to_durable)
        self._record(trainer, to_durable=to_durable)

    def _record(self, trainer: pl.Trainer, **times: float | None) -> None:
        if trainer.is_global_zero and self._run_dir is not None:
            self._run_dir.attempts.saved_last_ckpt(**times)

    # -- the decision: every rank calls, rank 0 decides ------------------------------------------------

    def _decide(self, trainer: pl.Trainer) -> None:
        from lightning_resume._collectives import broadcast, max_over_ranks

        strategy = trainer.strategy
        # The slowest rank's stall holds every rank: the mean of its saves after its first.
        later = max_over_ranks(strategy, _micro(mean_stall(self._stalls)))
        steps = self._choose(_seconds(later)) if trainer.is_global_zero else None
        self.steps = broadcast(strategy, steps)

    def _choose(self, later: float | None) -> int | None:
        """Rank 0: the interval from the measurements (or the recorded ones); the current one until known."""
        recorded = self._recorded
        count = len(self._stalls)
        mine = Stalls(later * count, count) if later is not None else Stalls()
        stall = save_cost(mine, recorded.stalls)
        durable = statistics.median(self._durables) if self._durables else recorded.to_durable
        if durable is None and self._writing is None and stall is not None:
            durable = stall
        step = statistics.median(self._step_times) if len(self._step_times) >= WINDOW else recorded.step
        step = (
            step if step is not None else (statistics.median(self._step_times) if self._step_times else None)
        )
        if stall is None or durable is None or step is None or self._run_dir is None:
            return self.steps  # measuring: FIRST_SAVE_STEPS until a save after a first one is timed
        assert self._prior is not None
        history: History = self._run_dir.attempts.history
        seen = interruptions(history, time.time())
        between = time_between_interruptions(seen, self._prior)
        choice = choose(Measurements(stall, max(durable, stall), step), between)
        if self.choice is None or material(self.steps, choice.steps):
            initial = self.choice is None
            self.choice = choice
            log.info(
                "RequeueCheckpoint(every_n_train_steps='auto') %s %s",
                "saves" if initial else "now saves",
                choice.describe(),
            )
            self._run_dir.attempts.chose_cadence(choice.to_dict())
            return choice.steps
        return self.steps
