"""Check that two Lightning checkpoints hold bitwise-identical weights and optimizer state.

    python compare.py uninterrupted/last.ckpt resumed/last.ckpt

Exit status 0 when every tensor is equal (`torch.equal`), 1 otherwise, naming what differs.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def tensors(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in nested dicts and lists, keyed by its path."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {}
    return {k: v for key, value in items for k, v in tensors(value, f"{prefix}/{key}").items()}


def main(a: str, b: str) -> int:
    left, right = (torch.load(path, map_location="cpu", weights_only=True) for path in (a, b))
    if left["global_step"] != right["global_step"]:
        print(f"different steps: {left['global_step']} and {right['global_step']}")
        return 1
    parts = ("state_dict", "optimizer_states")
    one = {k: v for part in parts for k, v in tensors(left[part], part).items()}
    two = {k: v for part in parts for k, v in tensors(right[part], part).items()}
    differ = sorted(
        k for k in one.keys() | two.keys() if k not in one or k not in two or not torch.equal(one[k], two[k])
    )
    if differ:
        print(f"{len(differ)} of {len(one)} tensors differ, e.g. {differ[:3]}")
        return 1
    print(f"identical: {len(one)} tensors at step {left['global_step']}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
