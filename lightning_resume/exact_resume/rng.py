"""Capture and restore the random number generators (the global ones, and an object's own) as tensors and
plain values: Lightning loads checkpoints with ``weights_only=True``, which refuses numpy objects."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    """The state of Python's, numpy's, torch's (and CUDA's, when present) global generators."""
    version, py_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def scoped(state: dict[str, Any]) -> Iterator[None]:
    """Draw from ``state`` inside the block; the generators get their own state back after it."""
    outside = capture()
    restore(state)
    try:
        yield
    finally:
        restore(outside)


def _generators(owner: Any) -> dict[str, Any]:
    kinds = (torch.Generator, np.random.Generator, random.Random)
    items = sorted(vars(owner).items()) if hasattr(owner, "__dict__") else []
    return {k: v for k, v in items if isinstance(v, kinds)}


def generator_states(owner: Any) -> dict[str, Any]:
    """The states of ``owner``'s own generators (:func:`_generators`), as tensors and plain values."""
    states: dict[str, Any] = {}
    for name, generator in _generators(owner).items():
        if isinstance(generator, torch.Generator):
            states[name] = generator.get_state()
        elif isinstance(generator, np.random.Generator):
            states[name] = generator.bit_generator.state
        else:
            version, internal, gauss = generator.getstate()
            states[name] = (version, torch.tensor(internal, dtype=torch.int64), gauss)
    return states


def set_generator_states(owner: Any, states: dict[str, Any]) -> None:
    for name, generator in _generators(owner).items():
        state = states.get(name)
        if state is None:
            continue
        if isinstance(generator, torch.Generator):
            generator.set_state(state)
        elif isinstance(generator, np.random.Generator):
            generator.bit_generator.state = state
        else:
            generator.setstate((state[0], tuple(int(v) for v in state[1].tolist()), state[2]))
