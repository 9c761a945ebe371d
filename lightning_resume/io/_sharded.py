"""Lightning glue for sharded checkpoints: what a strategy writes, and the verified choice on restart.

The pure directory rules (commit, verify, fallback order, cleanup) are in
:mod:`lightning_resume._writer.directory`; the saver in :mod:`lightning_resume.io._directory_saver`.

Seams, all in the callback ``RequeueCheckpoint``, because Lightning calls no ``CheckpointIO`` for
sharded saves and loads:

- **save**: ``trainer.save_checkpoint(<fresh directory>)`` on every rank, then the commit;
- **load**: ``Callback.setup`` runs after the process group exists and before the checkpoint is
  read (strategies that restore after setup read it after ``on_fit_start``): every rank verifies its
  share of the candidates there, ``last.ckpt`` is repointed to the one chosen, and a one-shot wrapper
  of ``strategy.load_checkpoint`` sends Lightning's load to it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies import Strategy

from lightning_resume._collectives import any_rank, barrier, broadcast, gather_objects
from lightning_resume._warnings import warn
from lightning_resume._writer import directory
from lightning_resume._writer.directory import DirectoryManifest
from lightning_resume.exceptions import CheckpointVerificationError
from lightning_resume.io.durable_checkpoint_io import DurableCheckpointIO

log = logging.getLogger(__name__)

#: Committed checkpoint directories kept when no ``DurableCheckpointIO(keep=...)`` says otherwise:
#: the current one and the previous one, the fallback.
DEFAULT_KEEP = 2


def keep_of(io: object) -> int:
    """How many committed checkpoint directories to keep: ``DurableCheckpointIO.keep``, else 2."""
    if isinstance(io, DurableCheckpointIO) and io.keep is not None:
        return io.keep
    return DEFAULT_KEEP


def _uses_dcp(strategy: Strategy) -> bool:
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    return isinstance(strategy, (ModelParallelStrategy, FSDPStrategy))


def model_key(strategy: Strategy) -> str:
    """The key of the model state in the strategy's DCP checkpoint (what its own load reads)."""
    from lightning.pytorch.strategies import FSDPStrategy

    return "model" if isinstance(strategy, FSDPStrategy) else "state_dict"


def dcp_state(strategy: Strategy, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Take the sharded state out of Lightning's ``checkpoint``, keyed as the strategy's save does.

    What remains of ``checkpoint`` is Lightning's ``meta.pt``.
    """
    state = {model_key(strategy): checkpoint.pop("state_dict")}
    state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
    return state


def required_files(strategy: Strategy) -> tuple[str, ...]:
    """Files a load of the strategy's checkpoint directory cannot do without."""
    return directory.DCP_REQUIRED if _uses_dcp(strategy) else ()


def layout_of(strategy: Strategy, writer: str) -> dict[str, Any]:
    """How a checkpoint was written, for its manifest: the strategy, its device mesh, the writer."""
    layout: dict[str, Any] = {"strategy": type(strategy).__name__, "writer": writer}
    try:
        mesh = getattr(strategy, "device_mesh", None)
    except RuntimeError:  # ModelParallelStrategy before setup
        mesh = None
    if mesh is not None:
        layout["mesh"] = {"shape": list(mesh.shape), "names": list(mesh.mesh_dim_names or ())}
    return layout


@dataclass(frozen=True)
class Choice:
    """The checkpoint directory a restart resumes from.

    Attributes:
        path: The chosen directory.
        manifest: Its manifest (``None`` for a directory written by plain Lightning, unverified).
        rejected: ``"<name>: <reason>"`` for each candidate that did not verify before it.
    """

    path: Path
    manifest: DirectoryManifest | None
    rejected: tuple[str, ...]


def choose(trainer: pl.Trainer, pointer: Path) -> Choice:
    """Verify the candidates on every rank together; return the first that verifies everywhere.

    Global rank 0 lists the candidates (``last.ckpt``'s target, then the other committed directories,
    newest save first); each rank checksums its share of each candidate's files; one all-reduce per
    candidate agrees on it. A directory without a manifest (written by plain Lightning) is used
    unverified, as a checkpoint file without one is: only the load can tell. Every rank must call this.

    Raises:
        CheckpointVerificationError: no candidate verifies (on every rank).
    """
    strategy = trainer.strategy
    rank, world = trainer.global_rank, trainer.world_size
    listed = [str(p) for p in directory.candidates(pointer)] if trainer.is_global_zero else []
    names = broadcast(strategy, listed)
    rejected: list[str] = []
    for name in names:
        verdict = directory.verify(Path(name), share=(rank, world))
        ok = verdict.status.usable
        if not any_rank(strategy, not ok):
            return Choice(Path(name), verdict.manifest, tuple(rejected))
        reasons = sorted({r for r in gather_objects(strategy, None if ok else verdict.reason) if r})
        rejected.append(f"{Path(name).name}: {'; '.join(reasons)}")
    if not names:
        found = f"nothing at {str(pointer)!r} and no committed checkpoint directory beside it"
    else:
        found = "; ".join(rejected)
    raise CheckpointVerificationError(
        f"This restart cannot resume: no checkpoint directory in {str(pointer.parent)!r} verifies ({found}). "
        "Restore the checkpoint directory (or its mirror) from a copy, or start a new run.",
        pointer,
        rejected[0] if rejected else "missing",
    )


def prepare_resume(trainer: pl.Trainer, pointer: Path, keep: int) -> Choice:
    """In ``setup`` of a restart: clean up, verify, fall back, repoint ``last.ckpt`` (every rank).

    Leftovers of the interrupted attempt (save directories, directories beyond ``keep``) are removed
    first. A candidate that does not verify is skipped with one warning and deleted once a fallback is
    chosen, so that retention never keeps it in place of a good one.

    Raises:
        CheckpointVerificationError: no checkpoint directory verifies.
    """
    strategy = trainer.strategy
    if trainer.is_global_zero:
        removed = directory.clean_stale(pointer.parent, pointer, keep, restart=True)
        if removed:
            log.info("removed %d leftover(s) of interrupted saves in %s", len(removed), pointer.parent)
    barrier(strategy, "lightning_resume.clean")
    choice = choose(trainer, pointer)
    if trainer.is_global_zero:
        if choice.rejected:
            for rejected in choice.rejected:
                name = rejected.split(":", 1)[0]
                if name.startswith(directory.COMMITTED_PREFIX):  # never a directory we did not write
                    directory.remove_directory(pointer.parent / name)
            warn(
                f"Skipped and removed checkpoint director{'ies' if len(choice.rejected) > 1 else 'y'} that "
                f"did not verify: {' | '.join(choice.rejected)}. Resuming from {choice.path.name} "
                f"({describe(choice.manifest)}) instead, the newest checkpoint that verifies."
            )
        target = directory.resolve_pointer(pointer)
        if target is None or target.name != choice.path.name:
            directory.swap_pointer(pointer, choice.path.name)
        if choice.manifest is not None and choice.manifest.world_size != trainer.world_size:
            warn(
                f"Resuming {str(pointer)!r}, written by {choice.manifest.world_size} rank(s), on "
                f"{trainer.world_size} rank(s): torch.distributed.checkpoint reshards the model and "
                "optimizer state; the random state continues from rank 0's and the data order follows the "
                "new number of ranks, so the run is not bitwise comparable with an uninterrupted one."
            )
    barrier(strategy, "lightning_resume.repoint")
    return choice


def describe(manifest: DirectoryManifest | None) -> str:
    """``global step 40, epoch 3, 2 rank(s)`` for messages."""
    if manifest is None:
        return "no manifest: written by plain Lightning, unverified"
    parts = []
    if manifest.global_step is not None:
        parts.append(f"global step {manifest.global_step}")
    if manifest.epoch is not None:
        parts.append(f"epoch {manifest.epoch}")
    parts.append(f"{manifest.world_size} rank(s)")
    return ", ".join(parts)
