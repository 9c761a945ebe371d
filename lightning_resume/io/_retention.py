"""Which checkpoints a ``keep=N`` retention policy deletes (pure: names and entries in, names out)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping

from lightning_resume._writer.manifest import Entry

_NUMBER = re.compile(r"\d+")


def name_pattern(name: str) -> str:
    """The family a checkpoint name belongs to: its digits replaced by ``#``.

    Example::

        name_pattern("epoch=3-step=400.ckpt")  # "epoch=#-step=#.ckpt"
        name_pattern("last.ckpt")              # "last.ckpt"
    """
    return _NUMBER.sub("#", name)


def to_delete(checkpoints: Mapping[str, Entry], keep: int) -> list[str]:
    """Names beyond the newest ``keep`` of each name pattern (newest by save time, then name).

    Only verified checkpoints are passed in, and ``keep >= 1``, so the newest verified checkpoint of
    every pattern always stays.

    Raises:
        ValueError: for ``keep < 1``.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep!r}.")
    families: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for name, entry in checkpoints.items():
        families[name_pattern(name)].append((entry.saved_at, name))
    doomed: list[str] = []
    for members in families.values():
        members.sort(reverse=True)
        doomed.extend(name for _, name in members[keep:])
    return sorted(doomed)
