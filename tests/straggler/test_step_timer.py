"""A rank's step split into its parts: the spans between the marks, and the gradient hooks that mark
the end of its own compute."""

from __future__ import annotations

import torch

from lightning_resume.straggler.step_timer import KEEP, HostClock, LastGrads, StepTimer


class Ticks(HostClock):
    """A clock that reads the times it is given, in order (the arithmetic, without sleeping)."""

    def __init__(self, *times: float) -> None:
        self.times = iter(times)
        self.mark = lambda: next(self.times)  # type: ignore[method-assign]


def test_a_step_is_split_at_its_marks_and_the_data_wait_runs_from_the_previous_end() -> None:
    # step 1: start 0, last gradient 3, backward done 7, optimizer 8..9, end 10
    # step 2: start 12 (2 s of data wait), no gradient hook fired: compute runs to the backward's end (15)
    timer = StepTimer(Ticks(0, 3, 7, 8, 9, 10, 12, 15, 16, 18, 19))
    timer.start()
    timer.grad_ready()
    timer.backward_done()
    timer.optimizer_start()
    timer.optimizer_done()
    timer.end()
    timer.start()
    timer.backward_done()
    timer.optimizer_start()
    timer.optimizer_done()
    timer.end()
    data, n_data, compute, n_compute, collective, n_collective, optimizer, n_optimizer = timer.close()
    assert (data, n_data) == (2, 1)  # the first step had no previous end in this window
    assert (compute, n_compute) == (3 + 3, 2)
    assert (collective, n_collective) == (4, 1)
    assert (optimizer, n_optimizer) == (1 + 2, 2)
    assert timer.close() == [0.0] * 8  # closed: its steps are forgotten


def test_an_interruption_leaves_the_next_data_wait_out() -> None:
    timer = StepTimer(Ticks(0, 1, 5, 6, 20, 21, 30, 31))
    for interrupted in (False, True, False):
        timer.start()
        timer.end()
        if interrupted:
            timer.interrupt()  # validation, a save, an epoch's end
    data, n_data, *_ = timer.close()
    assert (data, n_data) == (5 - 1, 1)  # only the wait before the second step


def test_the_last_gradients_are_learnt_in_the_first_backward_then_only_they_are_watched() -> None:
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(4)))
    calls: list[int] = []
    grads = LastGrads(model, lambda *_: calls.append(1))
    model(torch.randn(2, 4)).sum().backward()
    assert len(calls) == 8  # every parameter in the first backward
    grads.backward_done(fired=True)
    calls.clear()
    model(torch.randn(2, 4)).sum().backward()
    assert len(calls) == KEEP  # then the first layer's, the last to get a gradient
    grads.backward_done(fired=True)
    grads.detach()
    calls.clear()
    model(torch.randn(2, 4)).sum().backward()
    assert calls == []


def test_a_backward_that_reaches_none_of_the_watched_parameters_learns_again() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    calls: list[int] = []
    grads = LastGrads(model, lambda *_: calls.append(1))
    model(torch.randn(2, 4)).sum().backward()
    grads.backward_done(fired=True)
    model[0].requires_grad_(False)  # the watched first layer is frozen: its hooks never fire again
    calls.clear()
    model(torch.randn(2, 4)).sum().backward()
    assert calls == []
    grads.backward_done(fired=False)
    model(torch.randn(2, 4)).sum().backward()
    assert len(calls) == 2  # the second layer's weight and bias, watched now
    grads.detach()
