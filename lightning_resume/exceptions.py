"""Errors and warnings of lightning_resume: one family, each also a builtin (``RuntimeError``,
``ValueError``), so code that catches the builtin keeps working. The message says what to do."""

from __future__ import annotations

from pathlib import Path


class LightningResumeError(Exception):
    """Base of every error raised by lightning_resume.

    Attributes:
        path: The file or directory the error is about, if any.
    """

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None


class RunDirError(LightningResumeError, RuntimeError):
    """The run directory for this job cannot be decided without risking a lost or mixed-up run."""


class ResumeError(LightningResumeError, RuntimeError):
    """A restarted job cannot resume, and starting fresh would silently discard the run."""


class CheckpointVerificationError(ResumeError):
    """A checkpoint does not verify against its manifest, and no other checkpoint does either.

    Attributes:
        path: The checkpoint that was asked for.
        reason: Why it does not verify (``"torn (...)"``, ``"corrupt (...)"``, ...).
    """

    def __init__(self, message: str, path: str | Path | None = None, reason: str = "") -> None:
        super().__init__(message, path)
        self.reason = reason


class MissingCallbackError(ResumeError, ValueError):
    """A callback needs another one in the same ``Trainer`` (``RequeueCheckpoint`` needs ``RunDir``).

    Attributes:
        needed: The class name of the missing callback.
        needed_by: The class name of the callback that needs it.
    """

    def __init__(self, message: str, needed: str = "", needed_by: str = "") -> None:
        super().__init__(message)
        self.needed = needed
        self.needed_by = needed_by


class Preempted(SystemExit):
    """Raised to end ``fit`` after a preemption signal, once ``last.ckpt`` is durable: a ``SystemExit``
    whose non-zero :attr:`code` schedulers read as "not finished"."""


class CrashLoopStopped(SystemExit):
    """Raised by ``ProgressWatchdog`` before training when the run keeps ending at the same place.

    The last attempts (three by default) all ended without a new durable checkpoint. A ``SystemExit``
    with a status of its own (93 by default), which job scripts can tell from a failure worth
    retrying; ``lightning-resume reset-crash-loop RUN_DIR`` lets the next attempt train again.

    Attributes:
        message: What happened, in one line (the steps reached, the last error or hang, the stacks).
        attempts: How many attempts in a row ended without a new checkpoint.
    """

    def __init__(self, message: str, code: int = 93, attempts: int = 0) -> None:
        super().__init__(code)
        self.message = message
        self.attempts = attempts

    def __str__(self) -> str:
        return self.message


class LightningResumeWarning(UserWarning):
    """The category of every warning lightning_resume gives (filter it with ``warnings.filterwarnings``)."""
