"""``StepTimer``: where one rank's time goes in a window's steps (data wait, compute, collective wait,
optimizer step); on CUDA the marks are events on the current stream, read once per window."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

#: The parameters whose gradient hooks stay after the first backward: the last ones to get a gradient.
KEEP = 2


class HostClock:
    """Marks on the host's clock (``time.perf_counter``): right when the host does the work (CPU)."""

    mark = staticmethod(time.perf_counter)

    @staticmethod
    def seconds(start: float, end: float) -> float:
        return end - start

    def settle(self) -> None:
        """Every mark is a time already."""


class CudaClock:
    """Marks as CUDA events recorded on the current stream of ``device``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @staticmethod
    def mark() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def seconds(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1000.0

    def settle(self) -> None:
        """Wait until the device has passed every mark (once per window)."""
        torch.cuda.synchronize(self.device)


Clock = HostClock | CudaClock


class StepTimer:
    """The marks of one rank's steps in the current window (call the marks in the order of a step)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._mark = clock.mark
        self._steps: list[tuple[Any, ...]] = []
        self._end: Any = None  # the previous step's end, while only the loop and the data come after it
        self._start: Any = None
        self.grads: Any = None  # this step's last parameter gradient (None: none yet)
        self._backward: Any = None
        self._optimizer_start: Any = None
        self._optimizer: list[tuple[Any, Any]] = []

    def interrupt(self) -> None:
        """Not only data loading comes before the next step (a validation, a save): no data wait counted."""
        self._end = None

    def start(self) -> None:
        self._start = self._mark()
        self.grads = self._backward = self._optimizer_start = None
        self._optimizer = []

    def grad_ready(self, *_: Any) -> None:
        self.grads = self._mark()

    def backward_done(self) -> None:
        self._backward = self._mark()

    def optimizer_start(self) -> None:
        self._optimizer_start = self._mark()

    def optimizer_done(self, *_: Any) -> None:
        if self._optimizer_start is not None:
            self._optimizer.append((self._optimizer_start, self._mark()))
            self._optimizer_start = None

    def end(self) -> None:
        end = self._mark()
        if self._start is not None:
            self._steps.append((self._end, self._start, self.grads, self._backward, self._optimizer, end))
        self._end, self._start = end, None

    def resume(self) -> None:
        """The next data wait starts now (after work of our own at a step's end)."""
        if self._end is not None:
            self._end = self._mark()

    def close(self) -> list[float]:
        """The window's seconds and steps per part, ``[data, n, compute, n, collective, n, optimizer, n]``."""
        self.clock.settle()
        seconds = self.clock.seconds
        sums = [0.0] * 8

        def add(column: int, value: float) -> None:
            sums[column] += value
            sums[column + 1] += 1

        for before, start, grads, backward, optimizer, end in self._steps:
            if before is not None:
                add(0, seconds(before, start))
            done = next(
                m for m in (grads, backward, optimizer[0][0] if optimizer else None, end) if m is not None
            )
            add(2, seconds(start, done))
            if grads is not None and backward is not None:
                add(4, seconds(grads, backward))
            if optimizer:
                add(6, sum(seconds(a, b) for a, b in optimizer))
        self._steps = []
        return sums


class LastGrads:
    """Calls ``on_grad`` as the parameters of ``module`` that get their gradients last get one: learnt from
    every trainable one in the first backward (~1 us a call), then the last :data:`KEEP`; all again after a
    backward where none of those got one (a changed graph, frozen parameters)."""

    def __init__(self, module: torch.nn.Module, on_grad: Callable[..., None]) -> None:
        self._module = module
        self._on_grad = on_grad
        self._handles: list[Any] = []
        self._order: list[int] | None = None  # while learning: the parameters in the order they got one
        self._params: list[torch.nn.Parameter] = []
        self._watch_all()

    def _watch_all(self) -> None:
        self.detach()
        self._params = list({id(p): p for p in self._module.parameters() if p.requires_grad}.values())
        self._order = []
        for index, param in enumerate(self._params):
            self._handles.append(
                param.register_post_accumulate_grad_hook(functools.partial(self._learn, index))
            )

    def _learn(self, index: int, param: torch.Tensor) -> None:
        assert self._order is not None
        self._order.append(index)
        self._on_grad()

    def backward_done(self, fired: bool) -> None:
        """After a backward (``fired``: a watched parameter got a gradient in it)."""
        if self._order:
            last = list(dict.fromkeys(reversed(self._order)))[:KEEP]
            self.detach()
            self._order = None
            self._handles = [self._params[i].register_post_accumulate_grad_hook(self._on_grad) for i in last]
        elif self._order is None and not fired:
            self._watch_all()

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
