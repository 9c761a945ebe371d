"""Load a checkpoint file and check it against its manifest at the same time."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lightning_resume._storage.archive import intact_zip
from lightning_resume._storage.catalog import Status, Verdict, verify
from lightning_resume._storage.kinds import FILE
from lightning_resume._storage.manifest import Entry


@dataclass(frozen=True)
class Loaded:
    """The outcome of :func:`load_verified`: the ``checkpoint`` when the file may be used, else why not."""

    checkpoint: dict[str, Any] | None
    verdict: Verdict[Entry]
    reason: str = ""


def load_verified(path: Path, map_location: Any, weights_only: bool | None) -> Loaded:
    """Load ``path`` if it verifies (or, without a manifest, if it loads). What ``torch.load`` raises for
    an intact file (a ``weights_only`` refusal) is raised: that is not damage a fallback should hide."""
    pre = verify(path, FILE, checksums=False)
    if pre.status is Status.NO_MANIFEST:  # a file saved by plain Lightning
        try:
            return Loaded(torch.load(path, map_location=map_location, weights_only=weights_only), pre)
        except Exception as e:
            if intact_zip(path):
                raise
            return Loaded(None, pre, f"unreadable and has no manifest ({type(e).__name__}: {e})")
    if pre.status is not Status.VERIFIED:
        return Loaded(None, pre, pre.reason)
    found: dict[str, Verdict[Entry]] = {}
    # Hash beside the load: xxhash releases the GIL, so this costs little more than the load.
    worker = threading.Thread(target=lambda: found.update(verdict=verify(path, FILE)), daemon=True)
    worker.start()
    error: Exception | None
    try:
        checkpoint, error = torch.load(path, map_location=map_location, weights_only=weights_only), None
    except Exception as e:
        checkpoint, error = None, e
    finally:
        worker.join()
    verdict = found.get("verdict", Verdict(Status.CORRUPT, size=pre.size))
    if verdict.status is not Status.VERIFIED:
        return Loaded(None, verdict, verdict.reason)
    if error is not None:
        raise error
    return Loaded(checkpoint, verdict)
