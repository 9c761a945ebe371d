"""``lightning-resume inspect``: what a root or a run dir holds, and what the next restart will load, by the
rules the callbacks apply (``last_ckpt.restart``, and ``_storage.catalog``'s verification and fallback)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from lightning_resume._storage.catalog import Status, candidates, check_file, scan
from lightning_resume._storage.catalog import verify as check
from lightning_resume._storage.commit import newest_first, stale
from lightning_resume._storage.kinds import DIRECTORY, MANIFEST_NAME, resolve_pointer
from lightning_resume._storage.store import LocalStore
from lightning_resume.failure_classes import ending
from lightning_resume.io.sharded.parts import LIGHTNING_META
from lightning_resume.last_ckpt.auto_cadence import last_cadence
from lightning_resume.last_ckpt.restart import Restart, decide
from lightning_resume.run_dir import attempts, hangs, layout
from lightning_resume.run_dir.resolve import index_entries as read_index_entries
from lightning_resume.run_dir.resolve import read_meta
from lightning_resume.run_dir.saved_step import saved_step, step_from_file
from lightning_resume.run_dir.status import read_status
from lightning_resume.trackers.sidecar import SUFFIX as SIDECAR_SUFFIX
from lightning_resume.watchdog import crash_loop
from lightning_resume.watchdog import timeouts as watchdog_timeouts

LAST = layout.LAST_CKPT
#: ``result`` of a checkpoint a load may use.
USABLE = ("verified", "loads", "unverified")
#: ``result`` by verification status, where it is not the status's own value.
_RESULTS = {Status.TORN: "corrupt", Status.NO_MANIFEST: "unverified"}


def _world_size_from_file(path: Path) -> int | None:
    """How many ranks wrote a checkpoint file, from ``RequeueCheckpoint``'s per-rank states, or ``None``."""
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # the verification column says what is wrong with it
        return None
    callbacks = checkpoint.get("callbacks") if isinstance(checkpoint, dict) else None
    for state in (callbacks or {}).values():
        if isinstance(state, dict) and isinstance(state.get("ranks"), list) and state["ranks"]:
            return len(state["ranks"])
    return None


def verify(path: Path) -> dict[str, Any]:
    """Size, checksum, step and world size of one checkpoint, and whether it can be trusted (``result``)."""
    # A directory a sharded strategy wrote has our manifest or Lightning's meta.pt.
    if path.is_dir() and ((path / MANIFEST_NAME).exists() or (path / LIGHTNING_META).is_file()):
        return verify_directory(path)
    verdict = check_file(path)
    info: dict[str, Any] = {"name": path.name, "size": verdict.size, "checksum": verdict.checksum}
    if verdict.status is not Status.NO_MANIFEST:
        verified = verdict.status is Status.VERIFIED
        step = verdict.manifest.global_step if verified and verdict.manifest else None
        ranks = _world_size_from_file(path) if verified else None
        result = _RESULTS.get(verdict.status, verdict.status.value)
        return {**info, "step": step, "world_size": ranks, "result": result, "reason": verdict.detail}
    try:
        info["step"] = step_from_file(path)
    except Exception as e:  # any load failure means the file cannot be resumed from
        return {**info, "step": None, "result": "unreadable", "error": f"{type(e).__name__}: {e}"}
    return {**info, "world_size": _world_size_from_file(path), "result": "loads"}


def verify_directory(path: Path) -> dict[str, Any]:
    """A checkpoint directory (or ``last.ckpt`` linking to one) checked against its manifest and checksums."""
    verdict = check(path, DIRECTORY)
    manifest = verdict.manifest
    return {
        "name": path.name,
        "kind": "directory",
        "target": os.readlink(path) if path.is_symlink() else None,
        "size": manifest.size if manifest else None,
        "checksum": None,
        "step": manifest.global_step if manifest else None,
        "world_size": manifest.world_size if manifest else None,
        "strategy": dict(manifest.layout).get("strategy") if manifest else None,
        "result": _RESULTS.get(verdict.status, verdict.status.value),
        "reason": verdict.detail,
    }


def checkpoint_directories(folder: Path) -> list[dict[str, Any]]:
    """The committed checkpoint directories of a folder (newest save first) and leftovers of saves."""
    target = resolve_pointer(folder / LAST)
    found = [
        {**verify_directory(folder / name), "current": target is not None and target.name == name}
        for name in sorted(DIRECTORY.names(LocalStore(folder).sizes(deep=True)), reverse=True)
    ]
    leftover = {"kind": "leftover", "result": "leftover of an interrupted save"}
    return found + [{"name": name, **leftover} for name in stale(folder, restart=True)]


def next_load(run_dir: Path, checkpoints: list[dict[str, Any]]) -> tuple[str | None, str]:
    """Which checkpoint a restart of ``run_dir`` loads, and why (``RequeueCheckpoint``'s rule, fallback)."""
    rule = decide(run_dir)
    if rule is not Restart.RESUME:
        return None, rule.rule
    by_name = {c["name"]: c for c in checkpoints}
    last = by_name.get(LAST)
    if last is None:  # committed after the listing: the run is saving right now
        return LAST, "last.ckpt was committed while this listing was made"
    if last["result"] in USABLE:
        return LAST, f"last.ckpt {last['result']} (step {last['step']})"
    state = last["result"] + (f" ({last['reason']})" if last.get("reason") else "")
    if last.get("kind") == "directory":
        for path in candidates(layout.checkpoint_dir(run_dir) / LAST)[1:]:
            if check(path, DIRECTORY).status is Status.VERIFIED:
                why = "RequeueCheckpoint falls back to the newest checkpoint directory that verifies"
                return path.name, f"last.ckpt is {state}; {why}"
        why = "no other checkpoint directory verifies: the restart raises CheckpointVerificationError"
        return None, f"last.ckpt is {state} and {why}"
    why = "DurableCheckpointIO falls back to the newest checkpoint that verifies"
    for name in newest_first(scan(layout.checkpoint_dir(run_dir)), exclude=[LAST]):
        if by_name.get(name, {}).get("result") == "verified":
            return name, f"last.ckpt is {state}; {why}"
    return None, f"last.ckpt is {state} and no older checkpoint is verified"


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
    for entry in read_index_entries(root):
        if entry.target is None:
            entries.append({"key": entry.path.name, "target": None, "state": f"unreadable: {entry.error}"})
        else:
            state = "ok" if entry.target.is_dir() else "stale (run dir missing)"
            entries.append({"key": entry.path.name, "target": str(entry.target), "state": state})
    return entries


def describe_run(run_dir: Path) -> dict[str, Any]:
    meta = read_meta(run_dir)
    folder = layout.checkpoint_dir(run_dir)
    found = folder.glob(f"*{layout.CKPT_SUFFIX}")  # last.ckpt first, then the user's ModelCheckpoint's
    checkpoints = [verify(p) for p in sorted(found, key=lambda p: (p.name != LAST, p.name))]
    load, why = next_load(run_dir, checkpoints)
    try:
        root: Path | None = layout.root_of(run_dir)
    except IndexError:  # too short a path for a run dir under a root
        root = None
    entries = index_entries(root) if root is not None and layout.is_root(root) else []
    return {
        "path": str(run_dir),
        "run_id": meta.get("run_id", run_dir.name),
        "session_key": meta.get("session_key"),
        "created": meta.get("created"),
        "status": read_status(run_dir),
        "checkpoints": checkpoints,
        "checkpoint_directories": checkpoint_directories(folder),
        "next_restart_loads": {"checkpoint": load, "why": why},
        "index_entries": [e["key"] for e in entries if e["target"] and Path(e["target"]) == run_dir],
        "sidecars": _sidecars(run_dir),
        "attempts": attempts_report(run_dir),
    }


def attempts_report(run_dir: Path, hangs_shown: int = 3) -> dict[str, Any]:
    """The run's attempts (with the hang notes), how they ended, its last hangs and its crash-loop count."""
    history = attempts.with_notes(attempts.read(run_dir), hangs.read_notes(run_dir))
    last = history.last
    live = last.number if last is not None and last.end is None else None  # running, or killed
    streak = crash_loop.without_progress(history, before=live)
    settings = watchdog_timeouts.read(run_dir)
    closed = [(a, a.end) for a in history.attempts if a.end is not None]
    hung = [(a, end) for a, end in closed if end.cause is attempts.Cause.HUNG]
    return {
        "count": history.earlier.attempts + len(history.attempts),
        "attempts": [attempts.attempt_to_dict(a) for a in history.attempts],
        # "attempt 3 ended: out of memory on rank 1, exit 71, retried"
        "endings": [
            f"attempt {a.number} ended: {ending(end.failure, end.rank, end.exit_code, a is not last)}"
            for a, end in closed
            if end.failure is not None
        ],
        "hangs": [
            {
                "attempt": a.number,
                "section": hangs.section_label(end.section),
                "step": end.step,
                "seconds": end.seconds,
                "timeout": end.timeout,
                "rank": end.rank,
                "stacks": [str(run_dir / p) for p in end.stacks],
            }
            for a, end in hung[-hangs_shown:]
        ],
        "crash_loop": {
            "attempts_without_progress": len(streak),
            "limit": settings.get("max_attempts_without_progress"),
            "reset_after": history.reset_after,
        },
        "watchdog_timeouts": settings.get("timeouts"),
        "cadence": last_cadence(history),
    }


def describe_root(root: Path, now: float | None = None) -> dict[str, Any]:
    """The runs under a root, its index entries, orphans and handoff files."""
    now = time.time() if now is None else now
    entries = index_entries(root)
    indexed = {Path(e["target"]) for e in entries if e["target"]}
    keys = {e["key"] for e in entries}
    runs = []
    for run_dir in layout.run_dirs(root):
        meta = read_meta(run_dir)
        last = layout.last_checkpoint(run_dir)
        stamp = last if last.exists() else run_dir / layout.RUN_META
        key = meta.get("session_key")
        runs.append(
            {
                "path": str(run_dir),
                "run_id": meta.get("run_id", run_dir.name),
                "session_key": key,
                "status": read_status(run_dir).get("status"),
                "last_step": saved_step(last) if last.exists() else None,
                "age_seconds": round(now - stamp.stat().st_mtime, 1),
                "indexed": run_dir in indexed,
                "orphan": key is not None and run_dir not in indexed and key not in keys,
            }
        )
    handoff = root / layout.HANDOFF_DIR
    handoffs = sorted(p.name for p in handoff.iterdir()) if handoff.is_dir() else []
    return {"root": str(root), "runs": runs, "index": entries, "handoff_files": handoffs}
