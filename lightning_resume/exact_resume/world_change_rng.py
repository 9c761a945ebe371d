"""The random state each rank continues with on another number of ranks: its own saved one, or (a new rank)
every generator seeded from the run's seed, its rank and the saved step, alike on every such restart."""

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


def seeded_state(seed: int) -> dict[str, Any]:
    """Every generator's state seeded with ``seed`` (as :func:`rng.capture` gives it); the process's kept."""
    before = rng.capture()
    try:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)  # CUDA's generators too, when present
        return rng.capture()
    finally:
        rng.restore(before)


def rank_state(ranks: list[RankState], rank: int, seed: int | None, step: int) -> RankState:
    """What rank ``rank`` restores of ``ranks``: its own, or (a new rank) a derived random state only."""
    if rank < len(ranks):
        return ranks[rank]
    if seed is None:  # the run set none: a checksum of rank 0's saved torch state
        seed = zlib.crc32(ranks[0]["rng"]["torch"].numpy().tobytes())
    derived = (seed * 1_000_003 + rank * 7_919 + step) % 2**63
    return {"rng": seeded_state(derived), "draws": []}
