"""Which failure class an exception ends ``fit`` with: a pure function of the exception chain."""

from __future__ import annotations

from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from lightning_resume._compat.torch import failure_in_torch_terms
from lightning_resume.exceptions import CrashLoopStopped, Preempted, ResumeError
from lightning_resume.exit_status.exit_hook import chain
from lightning_resume.failure_classes import FailureClass

#: When the chain holds several classes, the first of this order wins: a collective that fails because
#: of another error is never the root cause.
PRECEDENCE = (
    FailureClass.PREEMPTED,
    FailureClass.CRASH_LOOP,
    FailureClass.OUT_OF_MEMORY,
    FailureClass.NON_FINITE,
    FailureClass.DATA,
    FailureClass.DO_NOT_RETRY,
    FailureClass.COMMUNICATION,
)


def _class_of(exception: BaseException) -> FailureClass | None:
    if isinstance(exception, (Preempted, SIGTERMException)):
        return FailureClass.PREEMPTED
    if isinstance(exception, CrashLoopStopped):
        return FailureClass.CRASH_LOOP
    if isinstance(exception, MemoryError):
        return FailureClass.OUT_OF_MEMORY
    if isinstance(exception, FloatingPointError):
        return FailureClass.NON_FINITE
    if isinstance(exception, (ResumeError, MisconfigurationException)):
        return FailureClass.DO_NOT_RETRY
    return failure_in_torch_terms(exception)


def classify(exception: BaseException, trained: bool) -> FailureClass | None:
    """The failure class of the exception that ends ``fit``.

    Args:
        exception: What ``fit`` raised.
        trained: Whether this attempt finished a training step: an error no class claims is then
            :attr:`~FailureClass.ERROR`, before that :attr:`~FailureClass.DO_NOT_RETRY` (a configuration,
            a bug).

    Returns:
        The class; ``None`` for an exit that is not a failure of ours (``KeyboardInterrupt``, another
        ``SystemExit``).

    Example::

        classify(torch.OutOfMemoryError("CUDA out of memory"), trained=True)  # FailureClass.OUT_OF_MEMORY
    """
    found = {c for c in map(_class_of, chain(exception)) if c is not None}
    if found:
        return next(c for c in PRECEDENCE if c in found)
    if isinstance(exception, (SystemExit, KeyboardInterrupt)):
        return None
    return FailureClass.ERROR if trained else FailureClass.DO_NOT_RETRY
