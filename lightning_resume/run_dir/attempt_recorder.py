"""``RunDir``'s record of this attempt in ``attempts.json``, written by rank 0. Nothing here raises: an
error in the record (a full disk) must not replace the error that ends ``fit``."""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_resume._scheduler.environment import launch_key
from lightning_resume.exceptions import CrashLoopStopped, Preempted
from lightning_resume.run_dir import attempts, hangs, layout
from lightning_resume.run_dir.attempts import Attempt, Cause, Checkpoint, End, History
from lightning_resume.run_dir.resolve import process_start_time
from lightning_resume.run_dir.saved_step import saved_step
from lightning_resume.run_dir.status import RunStatus

log = logging.getLogger(__name__)

FLUSH_SECONDS = 30.0  # seconds between two writes of the record during training (and at every end)


_F = TypeVar("_F", bound=Callable[..., None])


def _never_raises(method: _F) -> _F:
    """Report an error of ``method`` once as a warning instead of raising it."""

    @functools.wraps(method)
    def guarded(self: AttemptRecorder, *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception as e:
            self._report(e)

    return guarded  # type: ignore[return-value]


def _one_line(exception: BaseException) -> str:
    """``Type: first line of the message`` (at most 200 characters)."""
    message = str(exception).strip().splitlines()
    text = f"{type(exception).__name__}: {message[0]}" if message else type(exception).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _signal_name(trainer: pl.Trainer, exception: BaseException) -> tuple[str, str | None]:
    """The signal (or notice) ``PreemptionHandler`` stopped on and the notice's source; else ``SIGTERM``."""
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        report = getattr(callback, "stop_report", None)
        if report is not None and isinstance(getattr(report, "signal", None), str):
            notice = getattr(report, "notice", None)
            return report.signal, getattr(notice, "source", None)
        received = getattr(callback, "received", None)
        if isinstance(received, str):
            return received, None
    return ("SIGTERM" if isinstance(exception, SIGTERMException) else "a signal"), None


def _signalled(trainer: pl.Trainer) -> float | None:
    """When the signal ``PreemptionHandler`` stopped on arrived (wall clock), if it says."""
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        started = getattr(getattr(callback, "stop_report", None), "started", None)
        if isinstance(started, float) and started > 0:  # its time.monotonic()
            return time.time() - (time.monotonic() - started)
    return None


def _checkpoint_bytes(path: str) -> int | None:
    """The size of a local checkpoint file or directory (``None``: remote, or unreadable)."""
    if "://" in path:
        return None
    root = Path(path)
    try:
        if root.is_dir():
            return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        return root.stat().st_size
    except OSError:
        return None


def _rounded(record: dict[str, Any]) -> dict[str, Any]:
    return {key: round(value, 4) if isinstance(value, float) else value for key, value in record.items()}


def restore_record(
    io: object, path: str, loaded_at: float | None, since: float
) -> tuple[dict[str, Any], float | None]:
    """What the load of ``path`` by checkpoint ``io`` was, and when it ended (else ``loaded_at``)."""
    # ``DurableCheckpointIO.last_restore`` (duck-typed: a lower layer) counts when the load began after
    # ``since``, this process's first code: an older record is another fit's.
    to_dict = getattr(getattr(io, "last_restore", None), "to_dict", None)
    if callable(to_dict):
        record = dict(to_dict())
        started, seconds = _number(record.get("started")), _number(record.get("seconds"))
        if not started:  # not timed: its end is when the callbacks saw the state
            return _rounded(record), loaded_at
        if started >= since:
            return _rounded(record), loaded_at if seconds is None else started + seconds
    return {"tier": None, "path": path, "bytes": _checkpoint_bytes(path), "seconds": None}, loaded_at


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class AttemptRecorder:
    """Records this attempt in ``<run dir>/attempts.json`` (rank 0), the step every :data:`FLUSH_SECONDS`."""

    def __init__(self, run_dir: Path, code_started: float | None = None) -> None:
        self.run_dir = run_dir
        self._code_started = time.time() if code_started is None else code_started
        self._loaded_at: float | None = None  # when the checkpoint fit resumes from reached the callbacks
        self._history: History | None = None
        self._attempt: Attempt | None = None  # this attempt's record, without the fields below
        self._last_step: int | None = None
        self._last_step_time: float | None = None
        self._checkpoint_seen: tuple[Path, float] | None = None  # last.ckpt and its mtime, when read
        self._durable: Checkpoint | None = None
        self._last_flush = 0.0
        self._failed = False  # an error writing the record was reported once
        self._beat: int | None = None  # the step beat's file descriptor (rank 0, while training)
        self._failure: dict[str, Any] = {}  # the failure class the attempt ends with (``classified``)
        # Registered early: exit handlers run last-in first-out, so this one runs after those of the
        # objects made later (loggers, checkpoint IO), the closest to the exit a handler gets.
        atexit.register(self._exiting)

    @property
    def number(self) -> int | None:
        """This attempt's number (rank 0, once begun)."""
        return self._attempt.number if self._attempt is not None else None

    @property
    def history(self) -> History:
        """The history with this attempt as it stands (rank 0; empty elsewhere)."""
        if self._history is None:
            return History()
        if self._attempt is None:
            return self._history
        attempt = replace(self._attempt, last_step=self._last_step, last_step_time=self._last_step_time)
        return self._history.with_attempt(attempt)

    def _flush(self) -> None:
        if self._history is None:
            return
        history = self.history
        # The crash-loop reset may have been written by the command line meanwhile: keep it.
        on_disk = attempts.read(self.run_dir).reset_after
        history = replace(history, reset_after=max(history.reset_after, on_disk))
        self._last_flush = time.monotonic()
        attempts.write(self.run_dir, history)

    def _report(self, error: Exception) -> None:
        if not self._failed:
            self._failed = True
            log.warning("could not record the attempt in %s: %s", self.run_dir / layout.ATTEMPTS, error)

    def _last_ckpt(self, trainer: pl.Trainer) -> Path:
        """Where this run's ``last.ckpt`` is (``RequeueCheckpoint(dirpath=...)`` may move it)."""
        for callback in trainer.callbacks:  # type: ignore[attr-defined]
            if type(callback).__name__ == "RequeueCheckpoint":
                with contextlib.suppress(Exception):
                    return Path(callback.ckpt_path)
        return layout.last_checkpoint(self.run_dir)

    def durable(self, trainer: pl.Trainer) -> Checkpoint | None:
        """The newest durable checkpoint: ``last.ckpt``'s step and commit time (read when it changed)."""
        path = self._last_ckpt(trainer)
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return self._durable
        if self._checkpoint_seen == (path, mtime):
            return self._durable
        step = saved_step(path)
        self._checkpoint_seen = (path, mtime)
        if step is not None:
            self._durable = Checkpoint(step, mtime)
        return self._durable

    def known_step(self, trainer: pl.Trainer) -> int:
        """The step the run stands at: training's, or the durable checkpoint's before it is restored."""
        if self._durable is None and trainer.global_step == 0 and trainer.is_global_zero:
            try:
                self.durable(trainer)
            except Exception as e:
                self._report(e)
        durable = self._durable.step if self._durable is not None else 0
        return max(trainer.global_step, durable)

    def begin(self, trainer: pl.Trainer, stage: str = "fit") -> int | None:
        """Add this attempt to the history (once per ``fit``); its number on rank 0, else ``None``."""
        if stage != "fit" or not trainer.is_global_zero:
            return None
        if self._attempt is not None:
            return self._attempt.number
        try:
            history = attempts.read(self.run_dir)
            notes = hangs.read_notes(self.run_dir)
            attempt = Attempt(
                number=history.next_number(notes),
                host=socket.gethostname(),
                pid=os.getpid(),
                launch=launch_key(os.environ),
                started=process_start_time(),
                code_started=self._code_started,
            )
            beat = attempts.read_beat(self.run_dir)
            history = attempts.begin(history, attempt, self.durable(trainer), notes, beat)
            self._history, self._attempt = history, history.get(attempt.number)
            hangs.prune(self.run_dir, {a.number for a in history.attempts})
            self._flush()
        except Exception as e:  # the record must never stop training
            self._report(e)
        return self.number

    @_never_raises
    def train_started(self, trainer: pl.Trainer) -> None:
        """Record the step training resumes from (``None`` for a fresh start)."""
        if self._attempt is None:
            return
        resumed = trainer.global_step if trainer.ckpt_path else None
        self._attempt = replace(self._attempt, resumed_from=resumed)
        self._last_step = trainer.global_step
        if trainer.ckpt_path:
            io, path = trainer.strategy.checkpoint_io, str(trainer.ckpt_path)
            record, ended = restore_record(io, path, self._loaded_at, self._code_started)
            self._attempt = replace(self._attempt, restore=record, restored_at=ended)

    def loaded(self) -> None:
        """The checkpoint ``fit`` resumes from reached the callbacks (``on_load_checkpoint``): loaded."""
        self._loaded_at = time.time()

    @_never_raises
    def step(self, trainer: pl.Trainer) -> None:
        """After a training batch: the step reached, the first step's end; written every 30 s."""
        if self._attempt is None:
            return
        self._last_step, self._last_step_time = trainer.global_step, time.time()
        self._write_beat()
        if self._attempt.first_step is None:
            self._attempt = replace(self._attempt, first_step=self._last_step_time)
            self._last_flush = 0.0  # written at once: the restart's overhead is known
        if time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            with contextlib.suppress(Exception):
                self._attempt = replace(self._attempt, checkpoint=self.durable(trainer))
            self._flush()

    @_never_raises
    def saved(self, seconds: float) -> None:
        """Count a checkpoint save that held training for ``seconds`` (``ProgressWatchdog`` times them)."""
        if self._attempt is not None:
            self._attempt = replace(self._attempt, saves=self._attempt.saves.add(seconds))

    @_never_raises
    def saved_last_ckpt(self, stall: float | None = None, to_durable: float | None = None) -> None:
        """Record a save of ``last.ckpt``: its ``stall`` of training, and (once known) its ``to_durable``."""
        if self._attempt is None:
            return
        times = self._attempt.last_ckpt_saves
        times = times.stalled(stall) if stall is not None else times
        times = times.durable(to_durable) if to_durable is not None else times
        first_durable = times.durable_count == 1 and to_durable is not None
        self._attempt = replace(self._attempt, last_ckpt_saves=times)
        if stall is not None or first_durable:
            # At once (a small write next to a checkpoint's): a restart after a kill starts from these.
            self._flush()

    @_never_raises
    def self_checked(self, verdict: str) -> None:
        """Record the resume's self-check verdict (at once: ``inspect`` shows it)."""
        if self._attempt is None:
            return
        self._attempt = replace(self._attempt, self_check=verdict)
        self._flush()

    @_never_raises
    def chose_cadence(self, choice: dict[str, Any]) -> None:
        """Record the interval ``every_n_train_steps="auto"`` chose (at once: ``doctor`` shows it)."""
        if self._attempt is None:
            return
        changes = (self._attempt.cadence or {}).get("changes", -1) + 1
        cadence = {**choice, "time": round(time.time(), 3), "changes": changes}
        self._attempt = replace(self._attempt, cadence=cadence)
        self._flush()

    @_never_raises
    def stragglers(self, summary: dict[str, Any], at_once: bool = False) -> None:
        """Record ``StragglerDetector``'s summary (written with the next flush; ``at_once``: now)."""
        if self._attempt is None:
            return
        self._attempt = replace(self._attempt, stragglers=summary)
        if at_once:
            self._flush()

    def _write_beat(self) -> None:
        """Overwrite the step beat in place (no fsync: the page cache outlives a kill)."""
        assert self._attempt is not None and self._last_step is not None
        if self._beat == -1:
            return  # it could not be written: reported once
        try:
            if self._beat is None:
                self._beat = os.open(self.run_dir / attempts.BEAT, os.O_WRONLY | os.O_CREAT, 0o644)
            beat = attempts.Beat(self._attempt.number, self._last_step, self._last_step_time or 0.0)
            os.pwrite(self._beat, attempts.beat_line(beat), 0)
        except OSError as e:
            self._beat = -1
            self._report(e)

    @_never_raises
    def classified(self, failure: str, exit_code: int, rank: int, error: str = "") -> None:
        """Record ``ExitStatus``'s failure class, exit status, rank and error (into the end, once closed)."""
        self._failure = {"failure": failure, "exit_code": exit_code, "rank": rank, "error": error}
        if self._attempt is not None and self._attempt.end is not None:
            self._attempt = replace(self._attempt, end=self._classified(self._attempt.end))
            self._flush()

    def _classified(self, end: End) -> End:
        """``end`` with the failure class (a hang's has its own); a failure's error is the root cause's."""
        if end.failure is not None or not self._failure:
            return end
        found = dict(self._failure)
        error = found.pop("error")
        return replace(end, **found, **({"error": error} if end.cause is Cause.FAILED and error else {}))

    def _close(self, trainer: pl.Trainer, end: End) -> None:
        if self._beat is not None and self._beat >= 0:
            with contextlib.suppress(OSError):
                os.close(self._beat)
        self._beat = None
        if self._attempt is None:
            return
        checkpoint = self._attempt.checkpoint
        with contextlib.suppress(Exception):
            checkpoint = self.durable(trainer) or checkpoint
        self._last_step = trainer.global_step if self._last_step is None else self._last_step
        self._attempt = replace(self._attempt, checkpoint=checkpoint, end=self._classified(end))
        self._flush()

    @_never_raises
    def finished(self, trainer: pl.Trainer) -> None:
        self._last_step = trainer.global_step
        self._close(trainer, End(time.time(), Cause.FINISHED, "finished"))

    @_never_raises
    def refresh(self, trainer: pl.Trainer) -> None:
        """At teardown: the final save is durable now; record its step."""
        if self._attempt is not None and self._attempt.end is not None:
            self._close(trainer, self._attempt.end)

    def stopped(self, trainer: pl.Trainer, exception: BaseException) -> tuple[RunStatus, str]:
        """``fit`` ends with ``exception``: close the record; return ``status.json``'s status and detail."""
        if trainer.state.fn == "fit" and trainer.is_global_zero:
            try:
                hang = self._stopped(trainer, exception)
            except Exception as e:
                self._report(e)
            else:
                if hang is not None:
                    return RunStatus.HUNG, hang
        if isinstance(exception, CrashLoopStopped):
            return RunStatus.CRASH_LOOP, type(exception).__name__
        preempted = isinstance(exception, (Preempted, SIGTERMException))
        return (RunStatus.PREEMPTED if preempted else RunStatus.FAILED), type(exception).__name__

    def _stopped(self, trainer: pl.Trainer, exception: BaseException) -> str | None:
        """Close the record; the hang's detail when a rank hung."""
        self.begin(trainer)  # an attempt that failed before RunDir's setup still counts
        number = self.number
        notes = [n for n in hangs.read_notes(self.run_dir) if n.attempt == number] if number else []
        if notes:
            # A rank hung: what ended fit here (a peer's collective failing as it exited) follows from it.
            end = attempts.hung_end(notes)
            self._close(trainer, end)
            return end.detail
        if isinstance(exception, CrashLoopStopped):
            end = End(time.time(), Cause.CRASH_LOOP_STOP, exception.message)
        elif isinstance(exception, (Preempted, SIGTERMException)):
            sig, notice = _signal_name(trainer, exception)
            after = f" after a {notice} notice" if notice is not None and not sig.endswith("notice") else ""
            detail = f"preempted by {sig}{after}"
            end = End(
                time.time(), Cause.PREEMPTED, detail, signal=sig, notice=notice, signalled=_signalled(trainer)
            )
        else:
            error = _one_line(exception)
            end = End(time.time(), Cause.FAILED, f"failed: {error}", error=error)
        self._close(trainer, end)
        return None

    def _exiting(self) -> None:
        """At the interpreter's exit: record when rank 0 exited (only this field: a CLI may have written)."""
        attempt = self._attempt
        if attempt is None or attempt.pid != os.getpid():
            return  # not rank 0, or a forked child
        # Nothing may be raised or said at exit (the streams may be closed): a miss leaves it unknown.
        with contextlib.suppress(Exception):
            history = attempts.read(self.run_dir)
            found = history.get(attempt.number)
            if found is not None and found.pid == attempt.pid and found.exited is None:
                attempts.write(self.run_dir, history.with_attempt(replace(found, exited=time.time())))
