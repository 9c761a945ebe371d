"""The failure class of each kind of exception, and of exception chains: the root cause wins (the real
errors of torch: ``tests/_compat/test_torch_failures.py``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from lightning_resume import CrashLoopStopped, Preempted, ResumeError, RunDirError
from lightning_resume.exit_status.classify import classify
from lightning_resume.exit_status.exit_hook import chain
from lightning_resume.failure_classes import FailureClass


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (Preempted(143), FailureClass.PREEMPTED),
        (SIGTERMException(), FailureClass.PREEMPTED),
        (CrashLoopStopped("stop", 93), FailureClass.CRASH_LOOP),
        (FloatingPointError("overflow"), FailureClass.NON_FINITE),
        (torch.distributed.DistBackendError("NCCL communicator was aborted"), FailureClass.COMMUNICATION),
        (
            RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms"),
            FailureClass.COMMUNICATION,
        ),
        (ResumeError("cannot resume"), FailureClass.DO_NOT_RETRY),
        (MisconfigurationException("bad trainer flag"), FailureClass.DO_NOT_RETRY),
    ],
)
def test_each_class_is_told_by_its_exception(error: BaseException, expected: FailureClass) -> None:
    assert classify(error, trained=True) is expected


def test_an_error_no_class_claims_is_do_not_retry_before_the_first_step_and_error_after() -> None:
    assert classify(KeyError("column"), trained=False) is FailureClass.DO_NOT_RETRY
    assert classify(RunDirError("ranks disagree"), trained=False) is FailureClass.DO_NOT_RETRY
    assert classify(KeyError("column"), trained=True) is FailureClass.ERROR


def test_an_interrupt_or_another_exit_is_no_failure_of_ours() -> None:
    assert classify(KeyboardInterrupt(), trained=True) is None
    assert classify(SystemExit(3), trained=True) is None


def test_the_root_cause_in_the_chain_wins_over_the_failed_collective() -> None:
    def oom_then_collective() -> None:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError:
            raise RuntimeError("Connection closed by peer [10.0.0.2]:4242")  # noqa: B904 (a context)

    def resume_error_from_collective() -> None:
        try:
            raise torch.distributed.DistNetworkError("connection reset by peer")
        except RuntimeError as e:
            raise ResumeError("cannot agree on the checkpoint") from e

    def raised(make: Callable[[], None]) -> BaseException:
        with pytest.raises(BaseException) as caught:
            make()
        return caught.value

    error = raised(oom_then_collective)
    assert [type(e) for e in chain(error)] == [RuntimeError, torch.OutOfMemoryError]
    assert classify(error, trained=True) is FailureClass.OUT_OF_MEMORY
    assert classify(raised(resume_error_from_collective), trained=True) is FailureClass.DO_NOT_RETRY


def test_a_cycle_in_the_chain_ends() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert list(chain(a)) == [a, b]
    assert classify(a, trained=True) is FailureClass.ERROR
