"""``StopState``: where ``PreemptionHandler`` stands, from a preemption signal to the end of ``fit``. Pure.

The moves (:data:`TRANSITIONS`)::

    stage       event                                               next stage
    IDLE        TRAIN   (the sanity check or training starts)       TRAINING
    IDLE        STOP    (a signal before training: requeue, exit)   STOPPING
    TRAINING    SIGNAL  (acted on at the next check)                SIGNALLED
    TRAINING    STOP    (the ranks agreed: a notice, a peer's       STOPPING
                         signal; last.ckpt durable)
    TRAINING    LEAVE   (fit ended: teardown)                       IDLE
    SIGNALLED   STOP    (the next check: last.ckpt durable)         STOPPING
    STOPPING    END     (requeued; fit ends with Preempted)         STOPPED
    any         EXIT    (the interpreter runs its exit handlers)     EXITING

Any other ``TRAIN``, ``SIGNAL`` or ``LEAVE`` leaves the stage as it is (a signal pending at teardown
stops the next ``fit`` at its first check); a ``STOP`` or ``END`` elsewhere is a bug (``RuntimeError``);
``EXITING`` absorbs every event. A signal counts once: :meth:`StopState.signalled` keeps the first one
(name and time) and ignores later ones, and any in ``STOPPED`` (requeued already) or ``EXITING``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from signal import Signals

from lightning_resume.io.write_stats import WriteStats
from lightning_resume.preemption.notices._notice import Notice


class Stage(enum.Enum):
    IDLE = "idle"  #: not training (before the sanity check, after teardown): a signal exits at once
    TRAINING = "training"  #: a signal is acted on at the next check, by every rank at once
    SIGNALLED = "signalled"  #: a signal came: the next check stops
    STOPPING = "stopping"  #: the ranks agreed to stop and last.ckpt is durable: fit ends at the next hook
    STOPPED = "stopped"  #: fit ended with ``Preempted``, the job requeued
    EXITING = "exiting"  #: the interpreter runs its exit handlers: nothing more is done


class Event(enum.Enum):
    TRAIN = "train"
    SIGNAL = "signal"
    STOP = "stop"
    END = "end"
    LEAVE = "leave"
    EXIT = "exit"


_S, _E = Stage, Event
#: ``(stage, event) -> next stage`` where the stage changes (see the module's docstring for the rest).
TRANSITIONS: dict[tuple[Stage, Event], Stage] = {
    (_S.IDLE, _E.TRAIN): _S.TRAINING,
    (_S.IDLE, _E.STOP): _S.STOPPING,
    (_S.TRAINING, _E.SIGNAL): _S.SIGNALLED,
    (_S.TRAINING, _E.STOP): _S.STOPPING,
    (_S.TRAINING, _E.LEAVE): _S.IDLE,
    (_S.SIGNALLED, _E.STOP): _S.STOPPING,
    (_S.STOPPING, _E.END): _S.STOPPED,
}


@dataclass(frozen=True)
class StopReport:
    """How a preemption stopped ``fit`` (``PreemptionHandler.stop_report``).

    Attributes:
        signal: The signal's name (``"a signal on another rank"``), or the notice (``"the aws-spot notice"``).
        step: The global step ``last.ckpt`` holds (``None`` when stopped before training).
        started: ``time.monotonic()`` of the signal (for a notice: of the ranks' decision to stop).
        seconds_to_durable: From then until ``last.ckpt`` was durable.
        requeue: What was done to requeue the job (``None`` until it is decided).
        seconds_to_exit: From the signal until ``fit`` ended.
        write: How ``last.ckpt`` was written, when the plugin reports it (``DurableCheckpointIO.last_write``).
        notice: The preemption notice acted on before the stop, if any.
        notice_to_durable: Seconds from that notice until the first ``last.ckpt`` after it was durable.
        steps_after_notice: Steps trained after the notice's save and kept by the last save.
    """

    signal: str
    step: int | None
    started: float = 0.0
    seconds_to_durable: float | None = None
    requeue: str | None = None
    seconds_to_exit: float | None = None
    write: WriteStats | None = None
    notice: Notice | None = None
    notice_to_durable: float | None = None
    steps_after_notice: int | None = None

    @property
    def by_notice(self) -> bool:
        """Whether a notice stopped ``fit`` (not a signal)."""
        return self.signal.endswith(" notice")


@dataclass
class StopState:
    """The handler's stage, the first signal (and ``time.monotonic()`` of it) and the stop's report."""

    stage: Stage = Stage.IDLE
    signal: tuple[Signals, float] | None = None
    report: StopReport | None = field(default=None, repr=False)

    def move(self, event: Event) -> Stage:
        """Apply ``event``; the new stage (RuntimeError for one that cannot happen in this stage: a bug)."""
        if event is Event.EXIT or self.stage is Stage.EXITING:
            self.stage = Stage.EXITING
        elif (self.stage, event) in TRANSITIONS:
            self.stage = TRANSITIONS[(self.stage, event)]
        elif event in (Event.STOP, Event.END):
            raise RuntimeError(f"PreemptionHandler: {event.value!r} cannot happen while {self.stage.value}")
        return self.stage

    def signalled(self, sig: Signals, now: float) -> str | None:
        """A preemption signal: ``None`` when it counts (the first, before the requeue), else why not."""
        if self.stage is Stage.EXITING:
            return "while the process exits"
        if self.signal is not None:
            return f"while already stopping for {self.signal[0].name}"
        if self.stage is Stage.STOPPED:
            return "after the stop"
        self.signal = (sig, now)
        self.move(Event.SIGNAL)
        return None

    def stop(self, report: StopReport) -> None:
        """The ranks agreed to stop (``last.ckpt`` durable, or nothing to save): ``fit`` ends next."""
        self.move(Event.STOP)
        self.report = report

    @property
    def training(self) -> bool:
        """Whether a signal waits for the next check (rather than exiting at once)."""
        return self.stage in (Stage.TRAINING, Stage.SIGNALLED)
