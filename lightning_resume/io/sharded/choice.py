"""The checkpoint directory a restart resumes from, verified by every rank together in ``setup`` (after
the process group exists, before the checkpoint is read), with fallback; ``last.ckpt`` is repointed to it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl

from lightning_resume._collectives import any_rank, barrier, broadcast, gather_objects
from lightning_resume._storage.catalog import candidates, remedy, verify
from lightning_resume._storage.commit import remove
from lightning_resume._storage.kinds import COMMITTED_PREFIX, DirectoryKind, resolve_pointer, swap_pointer
from lightning_resume._storage.manifest import DirectoryManifest, describe
from lightning_resume._storage.store import LocalStore
from lightning_resume._warnings import warn
from lightning_resume.exceptions import CheckpointVerificationError
from lightning_resume.io.sharded.parts import clean_up

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    """The directory a restart resumes from, its manifest and the candidates ``rejected`` before it."""

    path: Path
    manifest: DirectoryManifest | None
    rejected: tuple[str, ...]


def choose(trainer: pl.Trainer, pointer: Path) -> Choice:
    """The first candidate that verifies on every rank (each hashing its share), else raise."""
    strategy = trainer.strategy
    rank, world = trainer.global_rank, trainer.world_size
    kind = DirectoryKind(pointer.name)
    names = broadcast(strategy, [str(p) for p in candidates(pointer)] if trainer.is_global_zero else [])
    rejected: list[str] = []
    newer = bool(names)
    for name in names:
        verdict = verify(Path(name), kind, share=(rank, world))
        ok = verdict.status.usable
        if not any_rank(strategy, not ok):
            return Choice(Path(name), verdict.manifest, tuple(rejected))
        newer = newer and verdict.newer
        reasons = sorted({r for r in gather_objects(strategy, None if ok else verdict.reason) if r})
        rejected.append(f"{Path(name).name}: {'; '.join(reasons)}")
    found = (
        "; ".join(rejected) or f"nothing at {str(pointer)!r} and no committed checkpoint directory beside it"
    )
    raise CheckpointVerificationError(
        f"This restart cannot resume: no checkpoint directory in {str(pointer.parent)!r} verifies ({found}). "
        f"{remedy(newer, 'the checkpoint directory (or its mirror)')}, or start a new run.",
        pointer,
        rejected[0] if rejected else "missing",
    )


def clean_leftovers(trainer: pl.Trainer, pointer: Path, keep: int) -> None:
    """At a restart (every rank): global rank 0 removes what interrupted saves left beside ``pointer``."""
    if trainer.is_global_zero and (removed := clean_up(pointer, keep, restart=True)):
        log.info("removed %d leftover(s) of interrupted saves in %s", len(removed), pointer.parent)
    barrier(trainer.strategy, "lightning_resume.clean")


def prepare_resume(trainer: pl.Trainer, pointer: Path, keep: int) -> Choice:
    """In ``setup`` of a restart (every rank): clean up, :func:`choose`, delete the rejected, repoint."""
    strategy = trainer.strategy
    clean_leftovers(trainer, pointer, keep)
    choice = choose(trainer, pointer)
    if trainer.is_global_zero:
        if choice.rejected:
            for rejected in choice.rejected:
                name = rejected.split(":", 1)[0]
                if name.startswith(COMMITTED_PREFIX):  # never a directory we did not write
                    remove(LocalStore(pointer.parent), DirectoryKind(pointer.name), name)
            warn(
                f"Skipped and removed checkpoint director{'ies' if len(choice.rejected) > 1 else 'y'} that "
                f"did not verify: {' | '.join(choice.rejected)}. Resuming from {choice.path.name} "
                f"({_describe(choice.manifest)}) instead, the newest checkpoint that verifies."
            )
        if (target := resolve_pointer(pointer)) is None or target.name != choice.path.name:
            swap_pointer(pointer, choice.path.name)
        if choice.manifest is not None and choice.manifest.world_size != trainer.world_size:
            # The data and random states follow the rules of RequeueCheckpoint's exact resume (issue 25).
            log.info(
                "Resuming %r, written by %d rank(s), on %d rank(s): torch.distributed.checkpoint reshards "
                "the model and optimizer state",
                str(pointer),
                choice.manifest.world_size,
                trainer.world_size,
            )
    barrier(strategy, "lightning_resume.repoint")
    return choice


def _describe(manifest: DirectoryManifest | None) -> str:
    """``global step 40, epoch 3, saved ..., 2 rank(s)`` for messages."""
    if manifest is None:
        return "no manifest: written by plain Lightning, unverified"
    return f"{describe(manifest)}, {manifest.world_size} rank(s)"
