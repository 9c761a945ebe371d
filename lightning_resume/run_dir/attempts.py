"""``attempts.json``: one :class:`Attempt` per attempt of a run, for the tools and the crash-loop rule; an
open record is closed as ``killed`` by the next attempt, or ``hung`` from the ranks' hang notes."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from lightning_resume._storage.atomic import write_json_atomic
from lightning_resume.failure_classes import FailureClass
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.hangs import HangNote, section_label

VERSION = 1
KEEP = 100  # attempts the file keeps (older ones are summed up in ``earlier``)


class Cause(str, enum.Enum):
    """How an attempt ended."""

    FINISHED = "finished"
    PREEMPTED = "preempted"
    FAILED = "failed"
    HUNG = "hung"
    KILLED = "killed"  # nobody closed the record (SIGKILL, OOM killer, lost node): the next attempt tells
    CRASH_LOOP_STOP = "crash-loop-stop"


#: Endings that interrupt training and lose the work since the last checkpoint.
INTERRUPTIONS = frozenset({Cause.PREEMPTED, Cause.FAILED, Cause.HUNG, Cause.KILLED})


@dataclass(frozen=True)
class Checkpoint:
    """A durable checkpoint: its global step and when it was committed."""

    step: int
    time: float


@dataclass(frozen=True)
class End:
    """How and when an attempt ended (the fields after ``detail`` are for the causes named)."""

    time: float  # for ``killed``: the last sign of life
    cause: Cause
    detail: str = ""  # one line for people
    signal: str | None = None  # preempted: the signal's name, or the notice that stopped it
    notice: str | None = None  # preempted: the source of a preemption notice acted on before the stop
    error: str | None = None  # failed: the exception type and the first line of its message
    section: str | None = None  # hung: where the first rank to report was
    step: int | None = None  # hung: the step it had reached; killed: its last step, if its beat told
    seconds: float | None = None  # hung: how long it had made no progress
    timeout: float | None = None  # hung: the timeout it exceeded
    rank: int | None = None  # hung: the first rank to report; with ``failure``: the rank it came from
    stacks: tuple[str, ...] = ()  # hung: every reporting rank's stacks file, relative to the run dir
    signalled: float | None = None  # preempted: when the signal arrived (a notice: when the ranks agreed)
    # The failure class the ranks exited with (``lightning_resume.failure_classes``) and its exit status.
    failure: str | None = None
    exit_code: int | None = None

    @property
    def fault(self) -> float:
        """When the fault happened: the signal's arrival, a hung rank's last progress, else :attr:`time`."""
        if self.signalled is not None:
            return self.signalled
        if self.cause is Cause.HUNG and self.seconds is not None:
            return self.time - self.seconds
        return self.time


#: The fields of :class:`End` that its JSON object holds only when set.
_END_OPTIONAL = tuple(f.name for f in fields(End) if f.name not in ("time", "cause", "detail", "stacks"))


@dataclass(frozen=True)
class Saves:
    """Checkpoint saves of an attempt, timed on the training thread (``ProgressWatchdog``)."""

    count: int = 0
    seconds: float = 0.0
    max_seconds: float = 0.0

    def add(self, seconds: float) -> Saves:
        return Saves(self.count + 1, self.seconds + seconds, max(self.max_seconds, seconds))


@dataclass(frozen=True)
class Stalls:
    """Save stalls pooled over saves (and attempts): their total and their number (``+`` pools them)."""

    seconds: float = 0.0
    count: int = 0

    def __add__(self, other: Stalls) -> Stalls:
        return Stalls(self.seconds + other.seconds, self.count + other.count)

    @property
    def mean(self) -> float | None:
        """The mean stall (``None`` for none)."""
        return self.seconds / self.count if self.count else None


@dataclass(frozen=True)
class LastCkptSaves:
    """``RequeueCheckpoint``'s saves of ``last.ckpt`` in an attempt, timed around its ``save``."""

    count: int = 0
    stall_seconds: float = 0.0  # their total stall of the training thread
    max_stall: float = 0.0
    last_stall: float | None = None
    durable_count: int = 0  # saves whose time to durable is known (a background write: once done)
    max_to_durable: float = 0.0  # from the start of a save until it was durable
    last_to_durable: float | None = None
    first_stall: float | None = None  # the first save pays the attempt's one-time costs

    @property
    def later(self) -> Stalls:
        """The stalls of the saves after the first (all of them in a record without ``first_stall``)."""
        if self.first_stall is None:
            return Stalls(self.stall_seconds, self.count)
        return Stalls(max(self.stall_seconds - self.first_stall, 0.0), max(self.count - 1, 0))

    def stalled(self, seconds: float) -> LastCkptSaves:
        return replace(
            self,
            count=self.count + 1,
            stall_seconds=self.stall_seconds + seconds,
            max_stall=max(self.max_stall, seconds),
            last_stall=seconds,
            first_stall=seconds if self.first_stall is None else self.first_stall,
        )

    def durable(self, seconds: float) -> LastCkptSaves:
        return replace(
            self,
            durable_count=self.durable_count + 1,
            max_to_durable=max(self.max_to_durable, seconds),
            last_to_durable=seconds,
        )


#: The keys of ``last_ckpt_saves`` in the file, in order.
_LAST_CKPT_KEYS: tuple[str, ...] = ("count", "stall_seconds", "max_stall", "last_stall", "first_stall")
_LAST_CKPT_KEYS += ("durable_count", "max_to_durable", "last_to_durable")


@dataclass(frozen=True)
class Attempt:
    """One attempt of the run (one launch of the job) as rank 0 recorded it (times: since the epoch)."""

    number: int  # 1 for the first attempt, then 2, 3, ...
    host: str  # rank 0's host and process id
    pid: int
    launch: str | None  # what the scheduler calls this launch (``None`` outside one)
    started: float  # when rank 0's process started
    # Launches since the previous attempt that left no record (:func:`unrecorded_between`); written if > 0.
    unrecorded_launches: int = 0
    resumed_from: int | None = None  # the step training resumed from (``None``: fresh, or not reached)
    checkpoint_at_start: Checkpoint | None = None  # the newest durable checkpoint when it began
    first_step: float | None = None  # when its first training step ended
    last_step: int | None = None  # the last global step it was seen at, and when
    last_step_time: float | None = None
    checkpoint: Checkpoint | None = None  # the newest durable checkpoint it saw
    saves: Saves = field(default_factory=Saves)
    last_ckpt_saves: LastCkptSaves = field(default_factory=LastCkptSaves)
    # The interval ``every_n_train_steps="auto"`` chose last (``Choice.to_dict()``, ``time``, ``changes``).
    cadence: dict[str, Any] | None = None
    # The resume's self-check: "exact (checked: ...)", "differs: ...", "unchecked"; None: no resume.
    self_check: str | None = None
    end: End | None = None  # ``None``: running, or ended without a word (until the next attempt)
    # The fields below are in the file only when known (older files lack them).
    code_started: float | None = None  # when ``RunDir`` was constructed in rank 0's process
    # The checkpoint load it resumed from: ``DurableCheckpointIO.last_restore.to_dict()``, else
    # ``{"tier": None, "path", "bytes", "seconds": None}``.
    restore: dict[str, Any] | None = None
    restored_at: float | None = None  # when that load ended (else when the loaded state reached callbacks)
    exited: float | None = None  # when rank 0's process began to exit (``None``: unknown, e.g. SIGKILL)
    # ``StragglerDetector``'s summary: window, windows, each rank's seconds per step by part, the ranks named.
    stragglers: dict[str, Any] | None = None

    @property
    def made_progress(self) -> bool:
        """Whether a newer durable checkpoint exists at its end than at its start."""
        if self.checkpoint is None:
            return False
        start = self.checkpoint_at_start
        return start is None or self.checkpoint.step > start.step

    @property
    def last_seen(self) -> float:
        """The last time the attempt is known to have been alive."""
        return max(t for t in (self.started, self.first_step, self.last_step_time) if t is not None)


@dataclass(frozen=True)
class Earlier:
    """The attempts dropped from the file, summed up (see :func:`exposure`)."""

    attempts: int = 0
    causes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    interruptions: int = 0


@dataclass(frozen=True)
class History:
    """The attempts of a run: the last :data:`KEEP`, oldest first, and the ``earlier`` ones dropped."""

    attempts: tuple[Attempt, ...] = ()
    earlier: Earlier = field(default_factory=Earlier)
    reset_after: int = 0  # attempts up to this one do not count towards a crash loop

    @property
    def last(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def next_number(self, notes: Iterable[HangNote] = ()) -> int:
        """The number the next attempt gets (hang notes count: an attempt may have hung unrecorded)."""
        numbers = [a.number for a in self.attempts] + [n.attempt for n in notes]
        return max(numbers, default=self.earlier.attempts) + 1

    def get(self, number: int) -> Attempt | None:
        return next((a for a in self.attempts if a.number == number), None)

    def with_attempt(self, attempt: Attempt) -> History:
        """This history with ``attempt`` replacing the one of the same number, or appended."""
        kept = [a for a in self.attempts if a.number != attempt.number]
        return replace(self, attempts=tuple(sorted([*kept, attempt], key=lambda a: a.number)))


# -- reading and writing ------------------------------------------------------------------------------

_T = TypeVar("_T")
_CASTS: dict[str, Callable[[Any], Any]] = {"int": int, "float": float}


def _numbers(cls: type[_T], data: Mapping[str, Any]) -> _T:
    """A dataclass from its JSON object: absent keys defaulted, ``int`` and ``float`` fields cast."""
    cast = {f.name: _CASTS.get(str(f.type), lambda v: v) for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{name: cast[name](data[name]) for name in cast if name in data})


def _checkpoint(data: Any) -> Checkpoint | None:
    if not isinstance(data, dict) or data.get("step") is None:
        return None
    return Checkpoint(int(data["step"]), float(data.get("time") or 0.0))


def _end(data: Any) -> End | None:
    if not isinstance(data, dict) or "cause" not in data:
        return None
    return End(
        time=float(data.get("time") or 0.0),
        cause=Cause(data["cause"]),
        detail=str(data.get("detail") or ""),
        stacks=tuple(data.get("stacks") or ()),
        **{key: data.get(key) for key in _END_OPTIONAL},
    )


def attempt_from_dict(data: dict[str, Any]) -> Attempt:
    as_is = ("launch", "resumed_from", "first_step", "last_step", "last_step_time", "self_check")
    known = ("code_started", "restored_at", "exited")  # in the file only when recorded
    objects = ("cadence", "restore", "stragglers")  # kept as they are
    return Attempt(
        number=int(data["attempt"]),
        host=str(data.get("host", "")),
        pid=int(data.get("pid", 0)),
        started=float(data.get("started") or 0.0),
        unrecorded_launches=int(data.get("unrecorded_launches") or 0),
        checkpoint_at_start=_checkpoint(data.get("checkpoint_at_start")),
        checkpoint=_checkpoint(data.get("checkpoint")),
        saves=_numbers(Saves, data.get("saves") or {}),
        last_ckpt_saves=_numbers(LastCkptSaves, data.get("last_ckpt_saves") or {}),
        end=_end(data.get("end")),
        **{key: data.get(key) for key in (*as_is, *known)},
        **{key: data[key] if isinstance(data.get(key), dict) else None for key in objects},
    )


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _checkpoint_to_dict(c: Checkpoint | None) -> dict[str, Any] | None:
    return None if c is None else {"step": c.step, "time": _rounded(c.time)}


def _end_to_dict(end: End | None) -> dict[str, Any] | None:
    if end is None:
        return None
    data: dict[str, Any] = {"time": _rounded(end.time), "cause": end.cause.value, "detail": end.detail}
    for key in _END_OPTIONAL:
        value = getattr(end, key)
        if value is not None:
            data[key] = round(value, 3) if isinstance(value, float) else value
    if end.stacks:
        data["stacks"] = list(end.stacks)
    return data


def attempt_to_dict(attempt: Attempt) -> dict[str, Any]:
    """The JSON object of an :class:`Attempt` (the optional keys only when set)."""
    unrecorded = {"unrecorded_launches": attempt.unrecorded_launches} if attempt.unrecorded_launches else {}
    when_set = {
        "stragglers": attempt.stragglers,
        "self_check": attempt.self_check,
        "code_started": _rounded(attempt.code_started),
        "restore": attempt.restore,
        "restored_at": _rounded(attempt.restored_at),
        "exited": _rounded(attempt.exited),
    }
    return {
        "attempt": attempt.number,
        "host": attempt.host,
        "pid": attempt.pid,
        "launch": attempt.launch,
        **unrecorded,
        "started": _rounded(attempt.started),
        "resumed_from": attempt.resumed_from,
        "checkpoint_at_start": _checkpoint_to_dict(attempt.checkpoint_at_start),
        "first_step": _rounded(attempt.first_step),
        "last_step": attempt.last_step,
        "last_step_time": _rounded(attempt.last_step_time),
        "checkpoint": _checkpoint_to_dict(attempt.checkpoint),
        "saves": {key: _rounded(value) for key, value in asdict(attempt.saves).items()},
        "last_ckpt_saves": {
            key: _rounded(getattr(attempt.last_ckpt_saves, key), 4) for key in _LAST_CKPT_KEYS
        },
        "cadence": attempt.cadence,
        **{key: value for key, value in when_set.items() if value is not None},
        "end": _end_to_dict(attempt.end),
    }


def to_dict(history: History) -> dict[str, Any]:
    return {
        "version": VERSION,
        "reset_after": history.reset_after,
        "earlier": {**asdict(history.earlier), "seconds": round(history.earlier.seconds, 3)},
        "attempts": [attempt_to_dict(a) for a in history.attempts],
    }


def from_dict(data: dict[str, Any]) -> History:
    """A :class:`History` from its JSON object (``ValueError``: not one this version reads)."""
    if not isinstance(data, dict) or not isinstance(data.get("attempts"), list):
        raise ValueError("not an attempt history: no 'attempts' list")
    earlier = data.get("earlier") or {}
    try:
        causes = {str(k): int(v) for k, v in (earlier.get("causes") or {}).items()}
        return History(
            attempts=tuple(attempt_from_dict(a) for a in data["attempts"]),
            earlier=replace(_numbers(Earlier, earlier), causes=causes),
            reset_after=int(data.get("reset_after", 0)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not an attempt history: {e}") from e


def read(run_dir: Path) -> History:
    """The attempt history of a run dir (empty when there is none or it cannot be read)."""
    try:
        return from_dict(json.loads((run_dir / layout.ATTEMPTS).read_text()))
    except (OSError, ValueError):
        return History()


def trimmed(history: History, keep: int = KEEP) -> History:
    """``history`` with at most ``keep`` attempts; the dropped ones are added to ``earlier``."""
    if len(history.attempts) <= keep:
        return history
    dropped, kept = history.attempts[:-keep], history.attempts[-keep:]
    causes = dict(history.earlier.causes)
    seconds, interruptions = exposure(History(attempts=dropped))
    for attempt in dropped:
        cause = attempt.end.cause.value if attempt.end is not None else "unknown"
        causes[cause] = causes.get(cause, 0) + 1
    earlier = Earlier(
        attempts=history.earlier.attempts + len(dropped),
        causes=causes,
        seconds=history.earlier.seconds + seconds,
        interruptions=history.earlier.interruptions + interruptions,
    )
    return replace(history, attempts=kept, earlier=earlier)


def write(run_dir: Path, history: History) -> None:
    """Write the history (the last :data:`KEEP` attempts) to ``attempts.json`` atomically."""
    write_json_atomic(run_dir / layout.ATTEMPTS, to_dict(trimmed(history)))


# -- what happened ------------------------------------------------------------------------------------


def hung_end(notes: Sequence[HangNote]) -> End:
    """The end of an attempt whose ranks left hang ``notes`` (the first one to report tells)."""
    first = min(notes, key=lambda n: n.time)
    stacks = tuple(sorted({n.stacks for n in notes}))
    step = "before training" if first.step is None else f"at step {first.step}"
    detail = (
        f"hung in {section_label(first.section)} {step}: rank {first.rank} made no progress for "
        f"{first.seconds:.0f} s (timeout {first.timeout:.0f} s); stacks in {', '.join(stacks)}"
    )
    told = {key: getattr(first, key) for key in ("section", "step", "seconds", "timeout", "rank")}
    hang = FailureClass.HANG
    return End(
        first.time, Cause.HUNG, detail, stacks=stacks, failure=hang.value, exit_code=hang.exit_code, **told
    )


def with_notes(history: History, notes: Sequence[HangNote]) -> History:
    """``history`` with the attempts its hang notes tell about marked ``hung``."""
    by_attempt: dict[int, list[HangNote]] = {}
    for note in notes:
        by_attempt.setdefault(note.attempt, []).append(note)
    for number, found in sorted(by_attempt.items()):
        attempt = history.get(number)
        end = hung_end(found)
        if attempt is None:
            if number <= history.earlier.attempts:
                continue  # already summed up
            first = min(found, key=lambda n: n.time)
            prior = [a for a in history.attempts if a.number < number]
            start = prior[-1].checkpoint if prior else None  # it started from the previous one's
            started = first.time - first.seconds
            attempt = Attempt(
                number, first.host, first.pid, None, started, checkpoint_at_start=start, checkpoint=start
            )
        # A hang is the root cause of a peer's failure as it exits: it replaces those endings.
        elif attempt.end is not None and attempt.end.cause not in (Cause.FAILED, Cause.KILLED, Cause.HUNG):
            continue
        reached = [s for s in (attempt.last_step, end.step) if s is not None]
        history = history.with_attempt(replace(attempt, end=end, last_step=max(reached, default=None)))
    return history


# -- the step beat: the last step of an attempt that is killed ---------------------------------------

#: Rank 0 overwrites this file at every step with its attempt, step and time (no fsync: it outlives a
#: killed process, in the page cache), so that the next attempt knows where a killed one stopped.
BEAT = ".attempt-step"
_BEAT_FORMAT = "{:>12d} {:>20d} {:>20.3f}\n"  # one fixed width: an overwrite never leaves a tail


@dataclass(frozen=True)
class Beat:
    """The last step an attempt reported: its number, the step and when."""

    attempt: int
    step: int
    time: float


def beat_line(beat: Beat) -> bytes:
    """The bytes of ``beat`` in the beat file (always the same length)."""
    return _BEAT_FORMAT.format(beat.attempt, beat.step, beat.time).encode()


def read_beat(run_dir: Path) -> Beat | None:
    """The run dir's step beat (``None`` when there is none or it cannot be read)."""
    try:
        attempt, step, when = (run_dir / BEAT).read_text().split()
        return Beat(int(attempt), int(step), float(when))
    except (OSError, ValueError):
        return None


def _killed(attempt: Attempt, beat: Beat | None) -> Attempt:
    """An open record closed as killed: at its beat's step and time when the beat is its own."""
    if beat is not None and beat.attempt == attempt.number and beat.step >= (attempt.last_step or 0):
        end = End(beat.time, Cause.KILLED, f"killed after step {beat.step} (no word from it)", step=beat.step)
        return replace(attempt, last_step=beat.step, last_step_time=beat.time, end=end)
    return replace(attempt, end=End(attempt.last_seen, Cause.KILLED, "ended without a word (killed?)"))


def begin(
    history: History,
    attempt: Attempt,
    checkpoint: Checkpoint | None,
    notes: Sequence[HangNote] = (),
    beat: Beat | None = None,
) -> History:
    """``history`` with ``attempt`` added from the durable ``checkpoint``, every open record closed."""
    history = with_notes(history, notes)
    for earlier in history.attempts:
        if earlier.end is None:
            history = history.with_attempt(_killed(earlier, beat))
    last = history.last
    # Nothing writes checkpoints between two attempts: the newest one now is the last one's.
    if (
        last is not None
        and checkpoint is not None
        and (last.checkpoint is None or checkpoint.step >= last.checkpoint.step)
    ):
        history = history.with_attempt(replace(last, checkpoint=checkpoint))
    unrecorded = unrecorded_between(last.launch if last is not None else None, attempt.launch)
    started = replace(
        attempt, checkpoint_at_start=checkpoint, checkpoint=checkpoint, unrecorded_launches=unrecorded
    )
    return history.with_attempt(started)


#: A launch key ending in the scheduler's restart count (``scheduler.launch_key``): SLURM's
#: ``slurm-<job>-step<step>-r<SLURM_RESTART_COUNT>``, TorchElastic's ``elastic-<run>-r<restart count>``.
_COUNTED = re.compile(r"^(?P<job>(?:slurm|elastic)-.+)-r(?P<count>\d+)$")


def unrecorded_between(before: str | None, launch: str | None) -> int:
    """How many launches between two attempts' launch keys left no record (a gap in the restart count)."""
    now = _COUNTED.match(launch or "")
    if now is None:
        return 0
    if before is None:
        return int(now["count"])  # the job's launches before this one all died unrecorded
    previous = _COUNTED.match(before)
    if previous is None or previous["job"] != now["job"]:
        return 0
    return max(int(now["count"]) - int(previous["count"]) - 1, 0)


def exposure(history: History) -> tuple[float, int]:
    """Seconds the closed attempts ran (``earlier`` included) and how many were :data:`INTERRUPTIONS`."""
    seconds, interruptions = history.earlier.seconds, history.earlier.interruptions
    for attempt in history.attempts:
        if attempt.end is None:
            continue
        seconds += max(attempt.end.time - attempt.started, 0.0)
        interruptions += attempt.end.cause in INTERRUPTIONS
    return seconds, interruptions
