"""Load a checkpoint file and check it against its manifest at the same time."""

from __future__ import annotations

import threading
import zipfile
from pathlib import Path
from typing import Any

import torch

from lightning_resume._manifest import Entry, checksum_file, match, read_entries, sized


def load_verified(
    path: Path, map_location: Any, weights_only: bool | None
) -> tuple[dict[str, Any] | None, Entry | None, str]:
    """Load ``path`` if it verifies.

    Returns:
        ``(checkpoint, entry, "")`` when the file matches an entry of its manifest, or has no
        manifest and loads (``entry`` is then ``None``); otherwise ``(None, None, reason)``, with
        ``reason`` ``"missing"`` or a phrase like ``"torn (12 bytes, ...)"``.

    Raises:
        Exception: what ``torch.load`` raises for a file that is intact (``weights_only`` refusals,
            an unknown format): that is not damage a fallback should hide.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None, None, "missing"
    entries = read_entries(path)
    if entries is None:  # a file saved by plain Lightning
        try:
            return torch.load(path, map_location=map_location, weights_only=weights_only), None, ""
        except Exception as e:
            if intact_zip(path):
                raise
            return None, None, f"unreadable and has no manifest ({type(e).__name__}: {e})"
    if not entries:
        return None, None, "unverifiable (its manifest is unreadable)"
    if not sized(entries, size):
        return None, None, f"torn ({size} bytes, matching no entry of its manifest)"
    digest: dict[str, tuple[int, str]] = {}
    # Hash beside the load: xxhash releases the GIL, so this costs little more than the load.
    worker = threading.Thread(target=lambda: digest.update(value=checksum_file(path)), daemon=True)
    worker.start()
    error: Exception | None = None
    checkpoint = None
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=weights_only)
    except Exception as e:
        error = e
    finally:
        worker.join()
    entry = match(entries, *digest["value"]) if "value" in digest else None
    if entry is None:
        return None, None, "corrupt (its checksum matches no entry of its manifest)"
    if error is not None:
        raise error
    return checkpoint, entry, ""


def intact_zip(path: Path) -> bool:
    """Whether ``path`` is a complete zip archive whose records all pass their CRC check."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return False
