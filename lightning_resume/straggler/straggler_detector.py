"""``StragglerDetector``: the rank that slows every DDP step named, with the part of its step that is slow."""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_resume._checks import is_number, the_one, whole_number
from lightning_resume._collectives import gather_numbers, gather_objects
from lightning_resume._compat.lightning import NOT_CALLED, put_callback
from lightning_resume._warnings import warn
from lightning_resume.run_dir.run_dir import RunDir, attempts_of
from lightning_resume.straggler.decision import RankTimes, Rule, Straggler, advance, milliseconds, named
from lightning_resume.straggler.step_timer import CudaClock, HostClock, LastGrads, StepTimer

log = logging.getLogger(__name__)

#: Steps of each fit left out before its first window: start-up costs (allocations, DDP's bucket
#: rebuild after its first step, a restored loader) are nobody's slowness.
WARMUP = 3
_COLUMNS = ("data", "compute", "collective", "optimizer")


def _at_least_zero(name: str, value: Any) -> float:
    if not is_number(value):
        raise TypeError(f"{name} must be a number, got {value!r}.")
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}.")
    return float(value)


def _means(sums: list[float], digits: int | None = None) -> list[float | None]:
    """The means of ``[total, count, total, count, ...]`` (``None`` for a count of 0)."""
    means = [total / count if count else None for total, count in zip(sums[::2], sums[1::2], strict=True)]
    return means if digits is None else [None if m is None else round(m, digits) for m in means]


class StragglerDetector(Callback):
    """Name the rank that slows every step of a DDP job, and the part of its step that is slow.

    Under DDP a slow rank (a throttled GPU, a slow disk for its shards, a noisy neighbour on its node)
    slows every rank: the others wait for it in the backward's all-reduce, so its own step looks normal.
    Each rank times what it does on its own in every step: the **data wait** (from the end of the
    previous step, after every callback's ``on_train_batch_end``, to this step's start), the **compute**
    (forward and backward until its last parameter gradient) and the **optimizer step**; and the
    **collective wait** (from its last gradient to the end of backward, where DDP waits for every rank's
    gradients: a straggler waits least). Once every ``window`` steps the ranks exchange their means in
    one small all-gather through the strategy. A rank is slow in a window when one of its own parts
    exceeds the median of the other ranks' by more than ``threshold`` times that median and by more than
    ``floor_ms``; when it has been slow ``patience`` windows in a row, global rank 0 names it once per
    job in a :class:`~lightning_resume.LightningResumeWarning` ("rank 3 on node gpu-017: data wait
    150 ms per step vs median 10 ms, 2 windows"), in ``attempts.json`` when a
    :class:`~lightning_resume.RunDir` is in the Trainer (``lightning-resume report`` shows every rank),
    and to ``on_straggler``.

    On a CUDA device the marks are CUDA events on the current stream, read once per window after one
    synchronize; elsewhere they are ``time.perf_counter`` on the host. In a single process it does
    nothing. A restart starts its windows afresh (the ranks named before are not named again).

    Args:
        window: Steps (training batches) per window; the ranks exchange their times once per window.
        threshold: How much slower than the median of the other ranks a part must be, as a fraction of
            that median (``0.2``: 20% slower).
        floor_ms: The least excess over that median, in milliseconds per step, that counts.
        patience: Windows in a row a rank must be slow before it is named.
        on_straggler: Called on global rank 0 with each :class:`~lightning_resume.Straggler` named (e.g.
            to keep its node out of the next launch); from YAML, the import path of a function.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for a ``window`` or ``patience`` below 1, or a negative ``threshold`` or ``floor_ms``.

    Example::

        trainer = Trainer(strategy="ddp", devices=8, callbacks=[RunDir(), StragglerDetector(window=50)])
    """

    def __init__(
        self,
        window: int = 100,
        threshold: float = 0.2,
        floor_ms: float = 50.0,
        patience: int = 2,
        on_straggler: Callable[[Straggler], object] | None = None,
    ) -> None:
        self.window = whole_number("window", window, minimum=1)
        self.threshold = _at_least_zero("threshold", threshold)
        self.floor_ms = _at_least_zero("floor_ms", floor_ms)
        self.patience = whole_number("patience", patience, minimum=1)
        if on_straggler is not None and not callable(on_straggler):
            raise TypeError(f"on_straggler must be a function of a Straggler, or None; got {on_straggler!r}.")
        self.on_straggler = on_straggler
        self._state_key = self._generate_state_key(window=self.window)  # read at every hook: made once
        self._named: list[Straggler] = []  # every rank named in this job (restored on resume)
        self._reset()

    def _reset(self) -> None:
        """Forget this fit's measurements (a new fit, a restart: its windows start afresh)."""
        self._timer: StepTimer | None = None  # None: not measuring (a single process, or not training)
        self._grads: LastGrads | None = None
        self._handles: list[Any] = []
        self._batches = 0
        self._streaks: dict[int, int] = {}
        self._hosts: list[str] | None = None
        self._windows = 0
        self._sums: list[list[float]] = []  # per rank: the sum of its window means per part, and counts
        self._named_here: list[Straggler] = []  # named in this fit (its attempt's record)
        self._run_dir: RunDir | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._state_key

    @property
    def stragglers(self) -> list[Straggler]:
        """The ranks named in this job so far (on every rank)."""
        return list(self._named)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        if trainer.world_size < 2:
            return
        self._run_dir = the_one(trainer, RunDir)
        device = trainer.strategy.root_device
        self._timer = timer = StepTimer(CudaClock(device) if device.type == "cuda" else HostClock())
        self._grads = LastGrads(pl_module, timer.grad_ready)
        self._handles = [o.register_step_post_hook(timer.optimizer_done) for o in trainer.optimizers]
        if trainer.callbacks[-1] is not self:  # type: ignore[attr-defined]
            # Last: a step ends after every callback's on_train_batch_end (their saves, collectives).
            put_callback(trainer, self, after=trainer.callbacks[-1])  # type: ignore[attr-defined]

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._timer is not None:
            self._timer.start()

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._timer is not None and self._grads is not None:
            self._timer.backward_done()
            self._grads.backward_done(self._timer.grads is not None)
            self._timer.optimizer_start()  # (gradient clipping counts to the optimizer step)

    # Per-step hooks it does not use: Lightning skips them rather than call each (a callback's cost).
    on_before_zero_grad = on_before_backward = on_before_optimizer_step = NOT_CALLED  # type: ignore[assignment]

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        timer = self._timer
        if timer is None:
            return
        timer.end()
        self._batches += 1
        counted = self._batches - WARMUP
        if counted == 0:
            timer.close()  # the warm-up steps are left out
        elif counted % self.window == 0:
            self._close_window(trainer)
            timer.resume()  # the exchange's wait is no data wait

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._interrupt()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._interrupt()

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._interrupt()

    def _interrupt(self) -> None:
        if self._timer is not None:
            self._timer.interrupt()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._stop()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stop()

    def _stop(self) -> None:
        """Remove every hook (idempotent); what was measured stays for ``stragglers``."""
        if self._grads is not None:
            self._grads.detach()
        for handle in self._handles:
            handle.remove()
        self._grads, self._handles, self._timer = None, [], None

    def _close_window(self, trainer: pl.Trainer) -> None:
        """Exchange the window's times (every rank, same step) and judge them alike; rank 0 reports."""
        assert self._timer is not None
        rows = gather_numbers(trainer.strategy, self._timer.close())
        if self._hosts is None:
            self._hosts = gather_objects(trainer.strategy, socket.gethostname())
        window = [RankTimes(*_means(row)) for row in rows]
        self._windows += 1
        self._add_to_summary(window)
        rule = Rule(self.threshold, self.floor_ms / 1000.0, self.patience)
        self._streaks, due = advance(self._streaks, window, rule)
        before = {(s.rank, s.host) for s in self._named}
        found = [
            named(slow, self._hosts[slow.rank], windows, trainer.global_step, window)
            for slow, windows in due
            if (slow.rank, self._hosts[slow.rank]) not in before
        ]
        self._named += found
        self._named_here += found
        if trainer.is_global_zero:
            log.debug("straggler window %d at step %d: %s", self._windows, trainer.global_step, window)
            self._report(found)

    def _add_to_summary(self, window: list[RankTimes]) -> None:
        if len(self._sums) != len(window):
            self._sums = [[0.0] * 8 for _ in window]
        for sums, times in zip(self._sums, window, strict=True):
            for index, part in enumerate(_COLUMNS):
                value = getattr(times, part)
                if value is not None and math.isfinite(value):
                    sums[2 * index] += value
                    sums[2 * index + 1] += 1

    def summary(self) -> dict[str, Any]:
        """This fit's record for ``attempts.json``: each rank's mean seconds per step by part over its
        windows, and the ranks named in it."""
        hosts = self._hosts or []
        ranks = [
            {
                "rank": rank,
                "host": hosts[rank] if rank < len(hosts) else "",
                **dict(zip(_COLUMNS, _means(sums, digits=6), strict=True)),
            }
            for rank, sums in enumerate(self._sums)
        ]
        named = [s.to_dict() for s in self._named_here]
        return {"window": self.window, "windows": self._windows, "ranks": ranks, "named": named}

    def _report(self, found: list[Straggler]) -> None:
        if self._run_dir is not None:
            attempts_of(self._run_dir).stragglers(self.summary(), at_once=bool(found))
        for straggler in found:
            waited = (
                f"; it waited {milliseconds(straggler.waited)} per step in collectives, the others "
                f"{milliseconds(straggler.others_waited)}"
                if straggler.waited is not None and straggler.others_waited is not None
                else ""
            )
            warn(
                f"StragglerDetector: {straggler.describe()} (at step {straggler.step}){waited}. Every rank "
                f"waits for it at each step: check that node ({_HINTS[straggler.part]}); `lightning-resume "
                "report RUN_DIR` shows every rank."
            )
            if self.on_straggler is not None:
                self.on_straggler(straggler)

    @override
    def state_dict(self) -> dict[str, Any]:
        # Only the ranks named: a restart measures afresh (its ranks may be on other nodes now, and the
        # steps between this checkpoint and a kill are lost).
        return {"named": [s.to_dict() for s in self._named]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._named = [Straggler.from_dict(s) for s in state_dict.get("named", [])]


#: What to look at on the node of a rank slow in each part.
_HINTS = {
    "data": "its disk or network file system, its data-loader workers, its CPU load",
    "compute": "its accelerator's clocks and temperature, other processes on it",
    "optimizer": "its accelerator, its CPU load",
}
