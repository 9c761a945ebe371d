"""``lightning-resume inspect``: what a root or a run dir holds, and what the next restart will do."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lightning_resume import _manifest
from lightning_resume._resolve import HANDOFF_DIR, INDEX_DIR, RUN_META, read_meta, read_status
from lightning_resume._sidecar import SUFFIX as SIDECAR_SUFFIX

LAST = "last.ckpt"


def is_run_dir(path: Path) -> bool:
    return (path / RUN_META).is_file()


def is_root(path: Path) -> bool:
    return (path / "runs").is_dir() or (path / INDEX_DIR).is_dir()


def _step_from_file(path: Path) -> int | None:
    """``global_step`` stored in a checkpoint, read with memory mapping (tensors are not loaded)."""
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
    return int(step) if step is not None else None


def quick_step(path: Path) -> int | None:
    """The step a checkpoint was saved at, from its manifest or a memory-mapped load; no checksum."""
    entries = _manifest.read_entries(path)
    if entries:
        return entries[0].global_step
    try:
        return _step_from_file(path)
    except Exception:  # a root listing shows a blank step; `inspect RUN_DIR` says why
        return None


def verify(path: Path) -> dict[str, Any]:
    """Size, checksum and step of one checkpoint file, and whether it can be trusted.

    ``result`` is ``verified`` (matches its manifest), ``corrupt`` (a manifest exists and nothing in
    it matches), ``loads`` (no manifest, but the file loads), or ``unreadable``.
    """
    size = path.stat().st_size
    info: dict[str, Any] = {"name": path.name, "size": size, "checksum": None, "step": None}
    entries = _manifest.read_entries(path)
    if entries:
        size, checksum = _manifest.checksum_file(path)
        info["checksum"] = checksum
        entry = _manifest.match(entries, size, checksum)
        if entry is not None:
            return {**info, "step": entry.global_step, "result": "verified"}
        return {**info, "result": "corrupt"}
    try:
        info["step"] = _step_from_file(path)
    except Exception as e:  # any load failure means the file cannot be resumed from
        return {**info, "result": "unreadable", "error": f"{type(e).__name__}: {e}"}
    return {**info, "result": "loads" if entries is None else "loads (manifest unreadable)"}


def next_load(checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    """Which checkpoint a restart loads, and why (``RequeueCheckpoint`` resumes from ``last.ckpt``;
    ``DurableCheckpointIO`` falls back to the newest verified older one when it is torn)."""
    good = ("verified", "loads", "loads (manifest unreadable)")
    last = next((c for c in checkpoints if c["name"] == LAST), None)
    if last is None:
        return {
            "checkpoint": None,
            "why": "no last.ckpt: a restart raises ResumeError instead of starting over",
        }
    if last["result"] in good:
        return {"checkpoint": LAST, "why": f"last.ckpt {last['result']} (step {last['step']})"}
    older = [c for c in checkpoints if c["name"] != LAST and c["result"] == "verified"]
    if older:
        best = max(older, key=lambda c: c["step"] if c["step"] is not None else -1)
        return {
            "checkpoint": best["name"],
            "why": f"last.ckpt is {last['result']}; DurableCheckpointIO falls back to the newest verified",
        }
    return {"checkpoint": None, "why": f"last.ckpt is {last['result']} and no older checkpoint is verified"}


def _sidecars(run_dir: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(run_dir.glob(f"*{SIDECAR_SUFFIX}")):
        tracker = path.name[: -len(SIDECAR_SUFFIX)]
        try:
            data = json.loads(path.read_text())
            identity = data.get("identity", data) if isinstance(data, dict) else {}
            found.append({"tracker": tracker, "identity": identity, "readable": True})
        except (OSError, ValueError) as e:
            found.append({"tracker": tracker, "identity": {}, "readable": False, "error": str(e)})
    return found


def index_entries(root: Path) -> list[dict[str, Any]]:
    """Every session index entry: its key, target, and whether the target exists."""
    entries = []
    folder = root / INDEX_DIR
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.name.startswith("."):
            continue
        try:
            target = path.read_text().strip()
        except OSError as e:
            entries.append({"key": path.name, "target": None, "state": f"unreadable: {e}"})
            continue
        state = "ok" if target and Path(target).is_dir() else "stale (run dir missing)"
        entries.append({"key": path.name, "target": target, "state": state})
    return entries


def describe_run(run_dir: Path, root: Path | None = None) -> dict[str, Any]:
    """Everything about one run dir."""
    meta = read_meta(run_dir)
    checkpoints = [verify(p) for p in sorted((run_dir / "checkpoints").glob("*.ckpt"))]
    root = root or _root_of(run_dir)
    pointing = (
        [e["key"] for e in index_entries(root) if e["target"] and Path(e["target"]) == run_dir]
        if root
        else []
    )
    return {
        "path": str(run_dir),
        "run_id": meta.get("run_id", run_dir.name),
        "session_key": meta.get("session_key"),
        "created": meta.get("created"),
        "status": read_status(run_dir),
        "checkpoints": checkpoints,
        "next_restart_loads": next_load(checkpoints),
        "index_entries": pointing,
        "sidecars": _sidecars(run_dir),
    }


def _root_of(run_dir: Path) -> Path | None:
    candidate = run_dir.parent.parent.parent.parent  # root/runs/YYYYMMDD/HHMMSS/<id>
    return candidate if is_root(candidate) else None


def describe_root(root: Path, now: float | None = None) -> dict[str, Any]:
    """The runs under a root, its index entries, orphans and handoff files."""
    now = time.time() if now is None else now
    entries = index_entries(root)
    indexed = {Path(e["target"]) for e in entries if e["target"]}
    runs = []
    for run_dir in sorted((root / "runs").glob("*/*/*")) if (root / "runs").is_dir() else []:
        if not is_run_dir(run_dir):
            continue
        meta = read_meta(run_dir)
        last = run_dir / "checkpoints" / LAST
        step = None
        if last.is_file():
            step = quick_step(last)
        stamp = last if last.is_file() else run_dir / RUN_META
        key = meta.get("session_key")
        runs.append(
            {
                "path": str(run_dir),
                "run_id": meta.get("run_id", run_dir.name),
                "session_key": key,
                "status": read_status(run_dir).get("status"),
                "last_step": step,
                "age_seconds": round(now - stamp.stat().st_mtime, 1),
                "indexed": run_dir in indexed,
                "orphan": key is not None
                and run_dir not in indexed
                and not any(e["key"] == key for e in entries),
            }
        )
    handoffs = sorted(p.name for p in (root / HANDOFF_DIR).iterdir()) if (root / HANDOFF_DIR).is_dir() else []
    return {"root": str(root), "runs": runs, "index": entries, "handoff_files": handoffs}
