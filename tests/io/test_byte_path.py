"""The byte path of a save, recorded: every package function that runs from ``save_checkpoint`` until the
file is committed on disk (the save's threads and the writer process included, import-time code left out),
for each route, against the files ``docs/src/architecture.md`` lists ("The byte path of a save").

The first save of a fresh plugin with retention (``keep=2``) is recorded: start-up (the writer process, the
leftovers of a directory) and retention are part of it. The writer process records its own calls through a
``sitecustomize`` on its ``PYTHONPATH``."""

from __future__ import annotations

import re
import sys
import threading
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

import lightning_resume
from lightning_resume import DurableCheckpointIO, MemoryTier
from lightning_resume.io.durable_checkpoint_io import memory_tier_of

PACKAGE = Path(lightning_resume.__file__).parent
DOCS = PACKAGE.parent / "docs" / "src" / "architecture.md"
ROUTES = ("asynchronous", "synchronous", "memory tier")
Calls = dict[str, set[str]]  # package file (relative, no suffix) -> the functions of it that ran

#: The writer process's recorder: a profiler from its start, written out at its exit.
SITECUSTOMIZE = """
import atexit, os, sys, threading
OUT, PACKAGE = os.environ["LR_BYTE_PATH_OUT"], os.environ["LR_BYTE_PATH_PACKAGE"]
seen = set()
def importing(frame):
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False
def profile(frame, event, arg):
    code = frame.f_code
    if event == "call" and code.co_filename.startswith(PACKAGE) and code.co_name != "<module>":
        if not importing(frame):
            seen.add((code.co_filename, code.co_name))
sys.setprofile(profile)
threading.setprofile(profile)
atexit.register(lambda: open(f"{OUT}.{os.getpid()}", "w").write("".join(f"{f}\\t{n}\\n" for f, n in seen)))
"""


def _file(filename: str) -> str:
    return Path(filename).relative_to(PACKAGE).with_suffix("").as_posix()


def _importing(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def record(route: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> Calls:
    """The package functions the first save of a fresh plugin on ``route`` runs, by file."""
    out = folder / "writer-calls"
    (folder / "site").mkdir(parents=True)
    (folder / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", f"{folder / 'site'}:{':'.join(sys.path)}")
    monkeypatch.setenv("LR_BYTE_PATH_OUT", str(out))
    monkeypatch.setenv("LR_BYTE_PATH_PACKAGE", str(PACKAGE))
    checkpoints = folder / "ckpt"
    memory = MemoryTier(folder / "shm", replicas=1, durable_every=1) if route == "memory tier" else None
    io = DurableCheckpointIO(asynchronous=route != "synchronous", keep=2, memory=memory)
    tier = memory_tier_of(io)
    if tier is not None:
        tier.attach(SingleDeviceStrategy(torch.device("cpu")), checkpoints)
        # This node's own server stands in for a second node: the copy to a peer runs for real.
        tier.memory.nodes = 2
        tier.memory._addresses[1] = tier.memory._addresses[0]
    calls: Calls = defaultdict(set)

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        ours = code.co_filename.startswith(str(PACKAGE)) and code.co_name != "<module>"
        if event == "call" and ours and not _importing(frame):
            calls[_file(code.co_filename)].add(code.co_name)

    state = {"global_step": 1, "state_dict": {"w": torch.randn(256, 256)}, "optimizer_states": []}
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        io.save_checkpoint(state, checkpoints / "last.ckpt")
        io.wait_until_durable()
        if tier is not None:
            tier.settle()  # the copy to the peer
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    io.teardown()
    if tier is not None:
        tier.close()
    for written in folder.glob("writer-calls.*"):  # the writer process wrote its own at its exit
        for line in written.read_text().splitlines():
            filename, name = line.split("\t")
            calls[_file(filename)].add(name)
    assert torch.equal(torch.load(checkpoints / "last.ckpt")["state_dict"]["w"], state["state_dict"]["w"])
    return dict(calls)


def documented() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """From the docs' table: the files of each route, and the functions named for each file."""
    section = DOCS.read_text().split("## The byte path of a save", 1)[1].split("\n## ", 1)[0]
    files: dict[str, set[str]] = {route: set() for route in ROUTES}
    functions: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 + len(ROUTES) or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`").removesuffix(".py")
        functions[name] = set(re.findall(r"`([A-Za-z_.]+)`", cells[1]))
        for route, mark in zip(ROUTES, cells[2:], strict=True):
            if mark:
                files[route].add(name)
    return files, functions


def test_a_save_runs_through_the_files_the_architecture_page_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, functions = documented()
    ran: Calls = defaultdict(set)
    for route in ROUTES:
        calls = record(route, tmp_path / route.replace(" ", "-"), monkeypatch)
        assert set(calls) == files[route], f"{route} ran through {sorted(calls)}"
        for name, names in calls.items():
            ran[name] |= names
    for name, named in functions.items():  # ``WriteNow.save`` is ``save`` in the profile
        missing = {f for f in named if f.rsplit(".", 1)[-1] not in ran[name]}
        assert not missing, f"{name}: {sorted(missing)} documented, never run"
