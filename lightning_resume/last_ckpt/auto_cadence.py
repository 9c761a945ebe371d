"""``every_n_train_steps="auto"``: Daly's optimum from the save stall and the time between interruptions (the
history, else a :class:`Prior`). The rules are standard library only (the CLI reads them)."""

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_resume._scheduler.environment import ENV, on_slurm
from lightning_resume._scheduler.machine import on_aws, on_azure, on_gce, read_machine
from lightning_resume._scheduler.slurm import slurm_output
from lightning_resume.run_dir import attempts
from lightning_resume.run_dir.attempts import INTERRUPTIONS, Attempt, Cause, History, LastCkptSaves, Stalls

if TYPE_CHECKING:  # the rules are read by the command line, which imports neither
    import lightning.pytorch as pl

    from lightning_resume.run_dir.attempt_recorder import AttemptRecorder

log = logging.getLogger(__name__)

#: The mean time between interruptions assumed when nothing else is known: a day.
DEFAULT_SECONDS = 24 * 3600.0
#: The same on a cloud virtual machine (maybe spot or preemptible: the firmware does not tell): six hours.
CLOUD_SECONDS = 6 * 3600.0
#: The interval until a save after an attempt's first is timed (the first pays one-time costs).
FIRST_SAVE_STEPS = 10
#: Saves after an attempt's first whose mean stall is the cost of a save (:func:`save_cost`).
SAVE_WINDOW = 16
#: A new interval replaces the current one only when this many times longer or shorter.
HYSTERESIS = 1.25
#: Batches timed before the first decision (a restart decides from its recorded save times then).
FIRST_DECISION_BATCHES = 5
#: Recent saves (times to durable) and steps whose median is used (a validation does not move it).
WINDOW = 5
STEP_WINDOW = 32


class PriorSource(str, enum.Enum):
    """Where the expected time between interruptions comes from before the history has any."""

    USER = "user"
    SLURM_TIME_LIMIT = "slurm time limit"
    CLOUD = "cloud"
    DEFAULT = "default"


@dataclass(frozen=True)
class Prior:
    """The expected time between interruptions before the run has seen one (``detail``: for people)."""

    seconds: float
    source: PriorSource
    detail: str


def prior(
    user_seconds: float | None = None, time_limit_seconds: float | None = None, cloud: str | None = None
) -> Prior:
    """The user's value, else the shortest of the SLURM time limit, a ``cloud`` VM's and a day."""
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
    """``TimeLimit=[days-]h:m:s`` of ``scontrol -o show job`` in seconds (``None``: unlimited or absent)."""
    found = re.search(r"(?:^|\s)TimeLimit=(\S+)", text)
    if found is None:
        return None
    days, _, clock = found.group(1).rpartition("-")
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
    """The SLURM job's time limit in seconds, from its environment or ``scontrol -o show job`` output."""
    try:
        start = int(environ.get("SLURM_JOB_START_TIME", "").strip())
        end = int(environ.get("SLURM_JOB_END_TIME", "").strip())
    except ValueError:
        start = end = 0
    if start > 0 and end > start:  # SLURM 23.02 and later
        return float(end - start)
    return parse_time_limit(scontrol_show_job) if scontrol_show_job else None


def interrupted(attempt: Attempt) -> bool:
    """Whether an attempt ended by an interruption (preempted, killed, hung, failed), lossy or not."""
    return attempt.end is not None and attempt.end.cause in INTERRUPTIONS


def lost_work(attempt: Attempt) -> bool:
    """Whether an interruption lost work (for people only: the interval counts every interruption)."""
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
    """The run's exposure in ``seconds``, its interruptions (lossy or not) and its attempts."""

    seconds: float
    count: int
    attempts: int
    lost_work: int = 0  # earlier summed-up attempts count none
    unrecorded: int = 0  # launches killed while starting


def interruptions(history: History, now: float) -> Interruptions:
    """The run's exposure and interruptions; an open record (the running one) counts until ``now``."""
    seconds, count, lossy, unrecorded = history.earlier.seconds, history.earlier.interruptions, 0, 0
    for attempt in history.attempts:
        end = attempt.end.time if attempt.end is not None else now
        seconds += max(end - attempt.started, 0.0)
        count += interrupted(attempt)
        lossy += lost_work(attempt)
        # Gaps in the scheduler's restart count: interruptions whose (short) seconds count as none.
        unrecorded += attempt.unrecorded_launches
    attempts = history.earlier.attempts + len(history.attempts) + unrecorded
    return Interruptions(seconds, count + unrecorded, attempts, lossy, unrecorded)


@dataclass(frozen=True)
class Between:
    """The expected time between interruptions; ``source``: ``"history"`` or the prior's."""

    seconds: float
    source: str
    detail: str


def time_between_interruptions(seen: Interruptions, before: Prior) -> Between:
    """The history's seconds per interruption once it has one, else the longer of the prior and the calm."""
    if seen.count:
        starting = f", {seen.unrecorded} killed while starting" if seen.unrecorded else ""
        detail = (
            f"{seen.count} interruption(s) in {duration(seen.seconds)} of this run "
            f"({seen.lost_work} lost work{starting})"
        )
        seconds, count = seen.seconds, seen.count
        if before.source is PriorSource.USER:
            # One more interruption (a gamma posterior's mean): it damps the first, noisy lifetimes, and a
            # history that disagrees outweighs it as it grows. The other priors are bounds: replaced.
            detail += f", and {before.detail} counted as one more"
            seconds, count = seconds + before.seconds, count + 1
        return Between(seconds / count, "history", f"the history: {detail}")
    if seen.seconds > before.seconds:
        detail = (
            f"no interruption in {duration(seen.seconds)} of this run, more than the prior {before.detail}"
        )
        return Between(seen.seconds, "history", f"the history: {detail}")
    return Between(before.seconds, before.source.value, f"the prior: {before.detail}")


@dataclass(frozen=True)
class Measurements:
    """Seconds a save holds the training thread, from its start until durable, and per optimizer step."""

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
    """An interval of ``steps`` chosen by :func:`choose`, with its inputs (for the log and ``doctor``)."""

    steps: int
    seconds: float
    young_daly: float  # daly()'s optimum (named before the higher-order form)
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
    """The mean (not the median: saves are often bimodal, and the interval trades their total cost)."""
    return math.fsum(stalls) / len(stalls) if stalls else None


def save_cost(later: Stalls, recorded: Stalls, enough: int = SAVE_WINDOW) -> float | None:
    """The mean stall of saves after an attempt's first (which pays one-time costs): ``later``'s once
    ``enough``, else with ``recorded`` (at a high interruption rate an attempt often makes no later save)."""
    pooled = later if later.count >= enough else later + recorded
    return pooled.mean


def daly(save_stall: float, between: float) -> float:
    """Daly's (2006) optimum ``sqrt(2dM) x (1 + sqrt(d/2M)/3 + d/18M) - d`` for ``d < 2M``, else ``M``."""
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
        between=between.seconds,
        between_source=between.source,
        between_detail=between.detail,
        **asdict(measured),  # save_stall, to_durable, step_seconds
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
        floats = ("seconds", "young_daly", "save_stall", "to_durable", "step_seconds", "between")
        return Choice(
            steps=int(data["steps"]),
            bound=Bound(bound) if bound is not None else None,
            between_source=str(data["between_source"]),
            between_detail=str(data["between_detail"]),
            **{k: float(data[k]) for k in floats},
        )
    except (KeyError, TypeError, ValueError):
        return None


def last_measured(history: History) -> LastCkptSaves | None:
    """The ``last.ckpt`` save times of the newest attempt that saved one (what a restart starts from)."""
    return next((a.last_ckpt_saves for a in reversed(history.attempts) if a.last_ckpt_saves.count), None)


def recorded_stalls(history: History, enough: int) -> Stalls:
    """The stalls of saves after each attempt's first, pooled over the newest attempts until ``enough``."""
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


def _cloud() -> str | None:
    machine = read_machine()
    return next(
        (n for n, test in (("aws", on_aws), ("gce", on_gce), ("azure", on_azure)) if test(machine)), None
    )


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
    """What a restart starts from (rank 0): recent stalls, the last time to durable, the last step time."""

    stalls: Stalls = field(default_factory=Stalls)
    to_durable: float | None = None
    step: float | None = None


@dataclass
class _Measured:
    """This attempt's measurements (every rank), made anew at each start of training."""

    start_step: int = 0
    batches: int = 0  # counted alike on every rank: decisions (collectives) are taken at the same one
    pending: bool = True  # a decision is due: at the start, and after each save
    first_saved: bool = False  # the attempt's first save is done (it pays one-time costs: left out)
    stalls: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=SAVE_WINDOW))
    durables: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=WINDOW))
    steps: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=STEP_WINDOW))
    last: tuple[int, float] | None = None  # the last optimizer step seen and when
    stalled: float = 0.0  # save stall since then (left out of the step time)


class AutoCadence:
    """``every_n_train_steps="auto"``: measures saves and steps (every rank), chooses (rank 0, broadcast)."""

    def __init__(self, expected_seconds: float | None) -> None:
        self.expected_seconds = expected_seconds  # expected_interruption_every
        self.steps = FIRST_SAVE_STEPS  # the interval every rank uses
        self.choice: Choice | None = None
        self._record: AttemptRecorder | None = None
        self._prior: Prior | None = None
        self._recorded = _Recorded()
        self._seen = _Measured()
        self._writing = False  # a save's background write is not durable yet

    def start(self, trainer: pl.Trainer, record: AttemptRecorder) -> None:
        """At the start of training: the run's recorded figures and the prior (rank 0)."""
        self._record, self._seen, self._writing = record, _Measured(start_step=trainer.global_step), False
        if not trainer.is_global_zero:
            return
        history = record.history
        measured, chosen = last_measured(history), last_cadence(history)
        self._recorded = _Recorded(
            recorded_stalls(history, SAVE_WINDOW),
            measured.last_to_durable if measured is not None else None,
            float(chosen["step_seconds"]) if chosen and chosen.get("step_seconds") else None,
        )
        if self._prior is None:
            self._prior = prior(self.expected_seconds, _time_limit(), _cloud())

    def saved(self, stall: float, to_durable: float | None) -> None:
        """A save held training ``stall`` s; ``to_durable``: ``None`` while written in the background."""
        seen = self._seen
        if seen.first_saved:
            seen.stalls.append(stall)
        seen.first_saved, seen.pending = True, True
        seen.stalled += stall
        self._writing = to_durable is None
        if to_durable is not None:
            seen.durables.append(to_durable)

    def durable(self, to_durable: float) -> None:
        """The background write of the newest save is done: ``to_durable`` from the save's start."""
        self._writing = False
        self._seen.durables.append(to_durable)

    def due(self, trainer: pl.Trainer, last_save_step: int) -> bool:
        """After a training batch with a new optimizer step (every rank): whether a save is due now."""
        seen, now, step = self._seen, time.monotonic(), trainer.global_step
        if seen.last is not None and step > seen.last[0]:
            seconds = max(now - seen.last[1] - seen.stalled, 0.0)
            seen.steps.append(seconds / (step - seen.last[0]))
        seen.last, seen.stalled = (step, now), 0.0
        seen.batches += 1
        if seen.pending and seen.batches >= FIRST_DECISION_BATCHES:
            seen.pending = False
            self._decide(trainer)
        return step - max(last_save_step, seen.start_step) >= self.steps

    def _decide(self, trainer: pl.Trainer) -> None:
        """Every rank calls; rank 0 decides from the slowest rank's mean stall, and broadcasts."""
        from lightning_resume._collectives import broadcast, max_over_ranks

        stall = mean_stall(self._seen.stalls)
        # In whole microseconds for the all-reduce (-1: none measured).
        later = max_over_ranks(trainer.strategy, round(stall * 1e6) if stall is not None else -1)
        steps = self._choose(later / 1e6 if later >= 0 else None) if trainer.is_global_zero else self.steps
        self.steps = broadcast(trainer.strategy, steps)

    def _choose(self, later: float | None) -> int:
        """Rank 0: the interval from the measurements (or the recorded ones); the current one until known."""
        seen, recorded = self._seen, self._recorded
        count = len(seen.stalls)
        mine = Stalls(later * count, count) if later is not None else Stalls()
        stall = save_cost(mine, recorded.stalls)
        durable = statistics.median(seen.durables) if seen.durables else recorded.to_durable
        if durable is None and not self._writing and stall is not None:
            durable = stall
        step = statistics.median(seen.steps) if len(seen.steps) >= WINDOW else recorded.step
        if step is None and seen.steps:
            step = statistics.median(seen.steps)
        if stall is None or durable is None or step is None or self._record is None:
            return self.steps  # measuring: FIRST_SAVE_STEPS until a save after a first one is timed
        assert self._prior is not None
        between = time_between_interruptions(interruptions(self._record.history, time.time()), self._prior)
        choice = choose(Measurements(stall, max(durable, stall), step), between)
        if self.choice is not None and not material(self.steps, choice.steps):
            return self.steps
        log.info(
            "RequeueCheckpoint(every_n_train_steps='auto') %s %s",
            "saves" if self.choice is None else "now saves",
            choice.describe(),
        )
        self.choice = choice
        self._record.chose_cadence(choice.to_dict())
        return choice.steps
