"""Where copies live and which one a restart loads: pure functions of paths, node counts and entries."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lightning_resume._storage.manifest import Entry

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def run_key(durable_dir: Path) -> str:
    """A run's folder in a memory tier, named after the durable checkpoint directory (every node agrees)."""
    digest = hashlib.sha256(str(durable_dir).encode()).hexdigest()[:16]
    readable = _UNSAFE.sub("-", f"{durable_dir.parent.name}-{durable_dir.name}").strip("-")[-48:]
    return f"{readable}-{digest}"


def copy_path(root: Path, key: str, origin: int, name: str) -> Path:
    """The copy of ``name`` written by node ``origin`` (its own on that node, a replica elsewhere)."""
    return root / key / f"node-{origin}" / name


def origin_of(path: Path) -> int:
    """The node that wrote the copy at ``path`` (see :func:`copy_path`)."""
    return int(path.parent.name.removeprefix("node-"))


def safe_part(text: str) -> bool:
    """Whether ``text`` may name a folder or file of the tier (what a peer sends is checked with it)."""
    return bool(text) and _UNSAFE.search(text) is None and text not in (".", "..")


def peers(node: int, nodes: int, replicas: int) -> list[int]:
    """The nodes holding replicas of ``node``'s copies: the next ``replicas`` around the ring."""
    return [(node + k) % nodes for k in range(1, min(replicas, nodes - 1) + 1)]


@dataclass(frozen=True)
class Copy:
    """A committed copy of a checkpoint in some node's memory tier, as its node reported it."""

    node: int  # where it is
    host: str
    origin: int  # the node that wrote it
    name: str
    entry: Entry

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "entry": self.entry.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Copy:
        return cls(**{**data, "entry": Entry.from_json(data["entry"])})


def _newness(entry: Entry) -> tuple[int, float]:
    return (entry.global_step if entry.global_step is not None else -1, entry.saved_at)


def choose(copies: Iterable[Copy], name: str, durable: Entry | None, node: int) -> list[Copy]:
    """The copies of ``name`` a restart may load instead of the durable one, best first: only the newest
    save any node holds, and only when it is newer than ``durable`` (or that very save); this node's
    own copies first, then by node. Empty: load the durable tier."""
    held = [c for c in copies if c.name == name]
    if not held:
        return []
    newest = max(_newness(c.entry) for c in held)
    best = [c for c in held if _newness(c.entry) == newest]
    if durable is not None:
        same = any(c.entry.same_data(durable) for c in best)
        if _newness(durable) >= newest and not same:
            return []  # the durable tier is as new: never an older or another save
        if durable.global_step is not None and newest[0] < durable.global_step:
            return []
    checksum = best[0].entry.checksum
    best = [c for c in best if c.entry.checksum == checksum]  # one save, whichever copies hold it
    return sorted(best, key=lambda c: (c.node != node, c.node))


def holders(copies: Sequence[Copy]) -> str:
    """The nodes holding ``copies``, for messages."""
    return ", ".join(f"node {c.node} ({c.host})" for c in copies)
