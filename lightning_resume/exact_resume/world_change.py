"""``WorldChange``: resume on another number of ranks, every sample seen once: the rest of the interrupted
epoch's global order (:mod:`.global_order`) split over the new ranks; what cannot be exact: one warning."""

from __future__ import annotations

import enum
import logging
import math
import os
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from lightning_resume._compat.lightning import set_epoch_position, wrapped_sampler
from lightning_resume._compat.torchdata import is_random_sampler
from lightning_resume._warnings import warn
from lightning_resume.exact_resume import global_order, stateful_loaders, world_change_rng
from lightning_resume.exact_resume.data_position import EpochSampler
from lightning_resume.exact_resume.global_order import GlobalOrder, OrderKind
from lightning_resume.exact_resume.remaining_order import RemainingOrder
from lightning_resume.exact_resume.resume_state import Loaded, RankState
from lightning_resume.exceptions import ResumeError

log = logging.getLogger(__name__)


class Positioned(enum.Enum):
    """What :meth:`WorldChange.at_train_start` did to the train data."""

    NOTHING = "nothing"
    #: The sampler was replaced (the run's order kept on one process); the caller positions the data.
    SAMPLER = "sampler"
    #: The rest of the epoch was split over the ranks: the caller only makes the iterator again.
    RESPLIT = "resplit"


def _sampler(loader: DataLoader) -> Any:
    """The sampler that orders ``loader``'s indices, inside the wrappers of lightning_resume."""
    batch_sampler = loader.batch_sampler
    sampler = getattr(batch_sampler, "sampler", None) if batch_sampler is not None else loader.sampler
    while isinstance(sampler, (RemainingOrder, EpochSampler)):
        sampler = sampler.sampler
    return sampler


def _replace_sampler(loader: DataLoader, sampler: Any) -> None:
    """Put ``sampler`` in place of the loader's, inside the wrapper that records its draws (if any)."""
    holder: Any = loader.batch_sampler
    while isinstance(holder.sampler, EpochSampler):
        holder = holder.sampler
    holder.sampler = sampler


def _is_random(sampler: Any, length: int) -> bool:
    """A one-process ``RandomSampler`` whose epoch is one permutation drawn from the global state."""
    return type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == length


def order_problem(loaders: list[Any]) -> str | None:
    """Why the train data's order cannot be continued on another number of ranks (``None``: it can)."""
    if len(loaders) != 1:
        return f"there are {len(loaders)} train loaders, and the position of each is kept per rank"
    (loader,) = loaders
    if not isinstance(loader, DataLoader):
        return f"the train data is a {type(loader).__name__}, not a torch DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return (
            f"the train data set {type(loader.dataset).__name__} is an IterableDataset, which splits "
            "itself over the ranks"
        )
    sampler = _sampler(loader)
    if isinstance(sampler, DistributedSampler):
        inner = wrapped_sampler(sampler)
        # torchdata's RandomSampler is replaced by a plain DistributedSampler (stateful_loaders).
        if inner is not None and not is_random_sampler(inner):
            return (
                f"Lightning wraps the train sampler {type(inner).__name__} in its DistributedSamplerWrapper, "
                "whose order depends on the number of ranks"
            )
        return None
    if isinstance(sampler, SequentialSampler) or _is_random(sampler, len(loader.dataset)):  # type: ignore[arg-type]
        return None
    return f"the train sampler {type(sampler).__name__} is not a DistributedSampler"


def _split(loader: DataLoader) -> tuple[Any, int, int]:
    """``loader``'s sampler (:func:`_sampler`), the ranks it splits the data over and the per-rank batch."""
    sampler = _sampler(loader)
    replicas = sampler.num_replicas if isinstance(sampler, DistributedSampler) else 1
    return sampler, replicas, int(getattr(loader.batch_sampler, "batch_size", None) or 1)


def _order_now(
    loader: DataLoader, epoch: int, batches: int, accumulate: int, origin: tuple[int, int, int] | None
) -> GlobalOrder:
    """The global order ``loader`` (with no :func:`order_problem`) follows, ``batches`` into ``epoch``."""
    sampler, replicas, batch_size = _split(loader)
    consumed, resplit = batches * batch_size * replicas, False
    if origin is not None and origin[0] == epoch:  # resplit: counted from where it was split
        _, start, start_batches = origin
        consumed, resplit = start + (batches - start_batches) * batch_size * replicas, True
    if isinstance(sampler, DistributedSampler):
        kind, shuffle, seed = OrderKind.PERMUTATION, sampler.shuffle, sampler.seed
        drop_last = sampler.drop_last
    else:  # one process: sequential, or a RandomSampler replayed from the epoch's start
        shuffle = not isinstance(sampler, SequentialSampler)
        kind = OrderKind.REPLAYED if shuffle else OrderKind.PERMUTATION
        seed, drop_last = 0, False
    return GlobalOrder(
        kind=kind,
        length=len(loader.dataset),  # type: ignore[arg-type]
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        epoch=epoch,
        consumed=consumed,
        replicas=replicas,
        batch_size=batch_size,
        resplit=resplit,
        global_batch=batch_size * replicas * accumulate,
    )


class WorldChange:
    """What a change of the number of ranks needs; ``keep_global_batch``: keep samples per optimizer step."""

    def __init__(self, keep_global_batch: bool = False) -> None:
        self.keep_global_batch = keep_global_batch
        self._order: GlobalOrder | None = None  # the loaded checkpoint's
        self._seed: int | None = None  # the loaded checkpoint's run seed
        self._step = 0  # the loaded checkpoint's global step
        self._origin: tuple[int, int, int] | None = None  # epoch, consumed, batches of a resplit epoch
        self._logged_states = False

    def to_save(self, trainer: pl.Trainer, loaders: list[Any], batches: int) -> dict[str, Any]:
        """The checkpoint's entries: ``order`` (``None`` when it cannot be followed), ``seed``, ``step``."""
        order = None
        if order_problem(loaders) is None:
            accumulate = int(trainer.accumulate_grad_batches)
            order = _order_now(loaders[0], trainer.current_epoch, batches, accumulate, self._origin)
        return {
            "order": order.to_dict() if order is not None else None,
            "seed": world_change_rng.run_seed(os.environ),
            "step": int(trainer.global_step),
        }

    def load(self, state: dict[str, Any]) -> None:
        self._order = GlobalOrder.from_dict(state.get("order"))
        seed = state.get("seed")
        self._seed = int(seed) if seed is not None else None
        self._step = int(state.get("step") or 0)
        self._origin = None
        self._logged_states = False

    @staticmethod
    def resplits(state: dict[str, Any], trainer: pl.Trainer) -> bool:
        """Whether a restart from ``state`` splits its epoch's rest anew (known before the loaders exist)."""
        order = GlobalOrder.from_dict(state.get("order"))
        if order is None or not state.get("mid_epoch", True):
            return False
        kwargs = trainer.distributed_sampler_kwargs  # the data-parallel ranks
        return order.resplit or order.replicas != (int(kwargs.get("num_replicas", 1)) if kwargs else 1)

    def rank_state(self, ranks: list[RankState], trainer: pl.Trainer) -> RankState:
        """This rank's saved states, by :mod:`.world_change_rng`'s rule when the number of ranks changed."""
        if len(ranks) != trainer.world_size and not self._logged_states:
            self._logged_states = True
            if trainer.is_global_zero:
                kept = min(len(ranks), trainer.world_size)
                new = trainer.world_size - kept
                log.info(
                    "Restart on %d rank(s) of a checkpoint written by %d rank(s): %s%s",
                    trainer.world_size,
                    len(ranks),
                    f"ranks 0 to {kept - 1} continue their saved random states"
                    if kept > 1
                    else "rank 0 continues its saved random state",
                    f"; {new} new rank(s) seed theirs from the run's seed, their rank and the step"
                    if new
                    else "",
                )
        return world_change_rng.rank_state(ranks, trainer.global_rank, self._seed, self._step)

    def at_train_start(self, trainer: pl.Trainer, loaded: Loaded | None, loaders: list[Any]) -> Positioned:
        """In ``on_train_start``: keep the order and global batch, split an interrupted epoch's rest.

        Raises:
            ResumeError: ``keep_global_batch`` and the new ranks do not divide the global batch.
        """
        order = self._order
        if loaded is None or order is None:
            self._warn_if_inexact(trainer, loaded, order_problem(loaders) or "the checkpoint has no record")
            return Positioned.NOTHING
        loader = loaders[0] if len(loaders) == 1 and isinstance(loaders[0], DataLoader) else None
        stateful = loader is not None and stateful_loaders.is_stateful(loader)
        kept = loader is not None and self._keep_order(loader, order)
        problem = order_problem(loaders)
        if loader is None or problem is not None:
            self._warn_if_inexact(trainer, loaded, problem or "no train loader")
            return Positioned.NOTHING
        sampler, replicas, _ = _split(loader)
        batch_note = self._global_batch(trainer, loader, order)
        mid_epoch = loaded.mid_epoch and order.epoch == trainer.current_epoch
        resplit = mid_epoch and (order.resplit or order.replicas != replicas or (kept and stateful))
        if not resplit:
            if len(loaded.ranks) != trainer.world_size and trainer.is_global_zero:
                log.info(
                    "Restart on %d rank(s) of a checkpoint written by %d rank(s) %s epoch %d; %s",
                    trainer.world_size,
                    len(loaded.ranks),
                    "in the middle of" if mid_epoch else "before",
                    trainer.current_epoch,
                    batch_note,
                )
            return Positioned.SAMPLER if kept else Positioned.NOTHING
        if not isinstance(sampler, DistributedSampler):
            self._warn_if_inexact(trainer, loaded, f"the train sampler {type(sampler).__name__} has no split")
            return Positioned.SAMPLER if kept else Positioned.NOTHING
        if stateful_loaders.unwrap_random_sampler(loader):  # as ExactResume does under DDP
            sampler = _sampler(loader)
        full = self._epoch_order(order, loaded)
        if full is None or len(full) != len(loader.dataset):  # type: ignore[arg-type]
            self._warn_if_inexact(trainer, loaded, "the train data set changed its length")
            return Positioned.SAMPLER if kept else Positioned.NOTHING
        remaining = full[order.consumed :]
        mine = global_order.split(remaining, sampler.num_replicas, sampler.rank, sampler.drop_last)
        batch_sampler: Any = loader.batch_sampler
        size = int(batch_sampler.batch_size)
        left = len(mine) // size if batch_sampler.drop_last else math.ceil(len(mine) / size)
        _replace_sampler(loader, RemainingOrder(sampler, trainer.current_epoch, mine))
        position = len(batch_sampler) - left
        set_epoch_position(trainer, position)
        self._origin = (trainer.current_epoch, order.consumed, position)
        if trainer.is_global_zero:
            log.info(
                "Restart on %d rank(s) of a checkpoint written by %d rank(s): epoch %d goes on with the %d "
                "of its %d samples not yet seen, %d per rank (%d batch(es)); %s",
                trainer.world_size,
                len(loaded.ranks),
                trainer.current_epoch,
                len(remaining),
                len(full),
                len(mine),
                left,
                batch_note,
            )
        return Positioned.RESPLIT

    def _keep_order(self, loader: DataLoader, order: GlobalOrder) -> bool:
        """On one process, keep a ``DistributedSampler``'s order (of seed, epoch), not a ``RandomSampler``."""
        sampler = _sampler(loader)
        if order.kind is not OrderKind.PERMUTATION or not order.shuffle:
            return False
        if not (_is_random(sampler, len(loader.dataset)) or is_random_sampler(sampler)):  # type: ignore[arg-type]
            return False
        kept: DistributedSampler[int] = DistributedSampler(
            loader.dataset, num_replicas=1, rank=0, shuffle=True, seed=order.seed, drop_last=order.drop_last
        )
        _replace_sampler(loader, kept)
        return True

    def _epoch_order(self, order: GlobalOrder, loaded: Loaded) -> list[int] | None:
        """The interrupted epoch's whole global order (``None``: it cannot be known)."""
        if order.kind is OrderKind.PERMUTATION:
            return global_order.permutation(order.length, order.shuffle, order.seed, order.epoch)
        draws = loaded.ranks[0].get("draws") or []
        started = draws[0].get("sampler") if draws and draws[0] else None
        if started is None:
            return None
        return global_order.sampler_order(order.length, started["rng"], started.get("generator"))

    def _global_batch(self, trainer: pl.Trainer, loader: DataLoader, order: GlobalOrder) -> str:
        """Keep the global batch (``keep_global_batch``) or say how it changed."""
        _, replicas, batch_size = _split(loader)
        per_step = batch_size * replicas
        before = order.global_batch
        if not self.keep_global_batch:
            now = per_step * int(trainer.accumulate_grad_batches)
            if now == before:
                return f"global batch {now} samples"
            return (
                f"global batch {before} -> {now} samples (the per-rank batch of {batch_size} is kept; "
                "RequeueCheckpoint(keep_global_batch=True) keeps the global batch)"
            )
        if before % per_step:
            fix = (
                f"restart on a number of ranks that divides {before // batch_size}"
                if before % batch_size == 0
                else f"use a per-rank batch size that divides {before}"
            )
            raise ResumeError(
                f"RequeueCheckpoint(keep_global_batch=True): the checkpoint's global batch of {before} "
                f"samples is not a multiple of the {per_step} samples one step takes on {replicas} rank(s) "
                f"with batches of {batch_size}: {fix}, or set keep_global_batch=False to keep the "
                "per-rank batch instead."
            )
        trainer.accumulate_grad_batches = before // per_step
        return (
            f"global batch {before} samples kept (accumulate_grad_batches={trainer.accumulate_grad_batches})"
        )

    def _warn_if_inexact(self, trainer: pl.Trainer, loaded: Loaded | None, problem: str) -> None:
        if loaded is None or not loaded.mid_epoch or len(loaded.ranks) == trainer.world_size:
            return
        warn(
            f"RequeueCheckpoint restarts on {trainer.world_size} rank(s) in the middle of an epoch that "
            f"{len(loaded.ranks)} rank(s) began, and cannot continue that epoch's order exactly ({problem}): "
            "the rest of the epoch follows the new ranks' split, so some of its samples are seen twice and "
            f"others not at all. Restart on {len(loaded.ranks)} rank(s), or train from one map-style data "
            "set with a DistributedSampler (Lightning's, or your own with use_distributed_sampler=False)."
        )
