"""Which random state each rank continues with after a restart on another number of ranks.

Rank ``r`` continues the stream rank ``r`` saved, when there is one; a new rank seeds every generator
from the run's seed, its rank and the saved step (:func:`new_rank_seed`), so restarts from one checkpoint
on one number of ranks draw alike. The run's seed is ``PL_GLOBAL_SEED`` (``seed_everything``) when the
checkpoint was written, or one derived from rank 0's saved torch state.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from lightning_resume.exact_resume import rng
from lightning_resume.exact_resume.resume_state import RankState

#: The variable ``lightning.fabric``'s ``seed_everything`` sets to the seed it used.
SEED_VARIABLE = "PL_GLOBAL_SEED"


def run_seed(environ: Mapping[str, str]) -> int | None:
    """The seed ``seed_everything`` set in this process (``None``: none, or not a number)."""
    try:
        return int(environ[SEED_VARIABLE])
    except (KeyError, ValueError):
        return None


def fallback_seed(ranks: list[RankState]) -> int:
    """A seed for a run that set none: a checksum of rank 0's saved torch state."""
    state = ranks[0]["rng"]["torch"]
    return zlib.crc32(state.numpy().tobytes())


def new_rank_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a rank the checkpoint's run did not have."""
    return (seed * 1_000_003 + rank * 7_919 + step) % 2**63


def seeded_state(seed: int) -> dict[str, Any]:
    """The state of every generator seeded with ``seed`` (as :func:`rng.capture` gives it); the
    process's own is left as it was."""
    before = rng.capture()
    try:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)  # CUDA's generators too, when present
        return rng.capture()
    finally:
        rng.restore(before)


def rank_state(ranks: list[RankState], rank: int, seed: int | None, step: int) -> RankState:
    """What rank ``rank`` restores from a checkpoint that saved ``ranks``: its own, or for a new rank a
    derived random state and no loader state."""
    if rank < len(ranks):
        return ranks[rank]
    derived = new_rank_seed(fallback_seed(ranks) if seed is None else seed, rank, step)
    return {"rng": seeded_state(derived), "draws": []}
