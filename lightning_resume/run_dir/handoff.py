"""Rank 0's run dir for the other ranks of one launch: each writes ``.handoff/<launch>.<nonce>.ask`` and waits
for the ``.answer`` beside it (a launch key may repeat, so no rank reads a file written before it asked)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from lightning_resume._storage.atomic import write_json_atomic
from lightning_resume.exceptions import RunDirError
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.owner import own_record
from lightning_resume.run_dir.resolve import Resolution, key_filename

ASK = ".ask"
ANSWER = ".answer"
#: Seconds between two looks: quick while a launch starts, then gentler on a shared filesystem.
_POLL, _SLOW_POLL, _QUICK_FOR = 0.02, 0.25, 10.0


def _prefix(launch: str) -> str:
    return f"{key_filename(launch)}."


class Answerer:
    """Rank 0's side: a thread answering each request of ``launch`` with ``resolution`` until :meth:`stop`."""

    def __init__(self, root: Path, launch: str, resolution: Resolution) -> None:
        self._folder = folder = root / layout.HANDOFF_DIR
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(
                f"Cannot publish this launch's run dir for its other ranks in {str(folder)!r} "
                f"({e.strerror or e}): they would wait for it in vain. {str(folder)!r} must be a writable "
                "folder: move away what is there, or free space.",
                folder,
            ) from e
        self._prefix = _prefix(launch)
        self._answer = {**json.loads(resolution.to_json()), "writer": own_record()}
        self._answered: set[str] = set()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lightning-resume-handoff", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        while True:
            self.answer_waiting()
            quick = time.monotonic() - started < _QUICK_FOR
            if self._stopped.wait(_POLL if quick else _SLOW_POLL):
                return

    def answer_waiting(self) -> int:
        """Answer the requests found now; return how many were new."""
        try:
            names = os.listdir(self._folder)
        except OSError:
            return 0
        new = 0
        for name in names:
            if not (name.startswith(self._prefix) and name.endswith(ASK)) or name in self._answered:
                continue
            self._answered.add(name)
            with contextlib.suppress(OSError):  # a request withdrawn meanwhile, a full disk: it times out
                write_json_atomic(self._folder / f"{name[: -len(ASK)]}{ANSWER}", self._answer)
                new += 1
        return new

    def stop(self) -> None:
        """Stop answering (every rank has its run dir); answers already written stay for their readers."""
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def ask(root: Path, launch: str, rank: int, timeout: float, poll: float = _POLL) -> Resolution:
    """A rank other than 0: ask rank 0 of this launch for its run dir and wait for the answer."""
    folder = root / layout.HANDOFF_DIR
    base = folder / f"{_prefix(launch)}{uuid.uuid4().hex}"
    request, answer = base.with_name(base.name + ASK), base.with_name(base.name + ANSWER)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if not request.exists():
                with contextlib.suppress(OSError):  # tried again at the next look
                    folder.mkdir(parents=True, exist_ok=True)
                    write_json_atomic(request, {"rank": rank, "writer": own_record()})
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # not there, or half-written
                return Resolution.from_json(answer.read_text())
            if time.monotonic() >= deadline:
                raise RunDirError(
                    f"Rank 0 did not publish its run dir for this launch under {str(folder)!r} within "
                    f"{timeout:.0f} s (this rank asked in {request.name!r}). Is rank 0 alive, and is the "
                    "runs root on a filesystem every rank shares? Raise RunDir(handoff_timeout=...) for "
                    "slow shared filesystems.",
                    folder,
                )
            time.sleep(poll)
    finally:
        for path in (request, answer):
            with contextlib.suppress(OSError):
                path.unlink()


def writer_of(path: Path) -> dict[str, Any]:
    """Who wrote a handoff file (``{}`` when it does not say): for ``gc``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    writer = data.get("writer") if isinstance(data, dict) else None
    return writer if isinstance(writer, dict) else {}
