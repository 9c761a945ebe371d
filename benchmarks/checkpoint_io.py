"""Checkpoint plugins side by side: time to durable against the disk floor, quiet and on a busy node.

Run: ``python benchmarks/checkpoint_io.py`` (1 GB and 4 GB, quiet and with 2 busy processes; about
an hour and a half on 2 cores, and it needs an otherwise quiet machine). A quick run:
``python benchmarks/checkpoint_io.py --sizes 256 --load 2 --saves 2``. ``BENCH_DIR`` chooses the
folder (default: the temporary folder), which decides the disk measured.

Only the stall (about 15 minutes at 1 GB and 4 GB): ``python benchmarks/checkpoint_io.py --only stall
--sizes 1024,4096 --load 2 --saves 5 --repeats 3``. There each process measures the rows (default:
``copy floor`` and ``ours async``) taking turns save by save, so that they see the same machine load,
and the table adds the median time of each staging phase of ours (``plan``, ``copy``, ``views``,
``pickle``, from its DEBUG log).

For a model + Adam state of the given sizes (on the GPU when there is one, else the CPU), each row
runs in its own process, under each load level (``--load N``: N other processes spinning on the CPU
for the whole measurement, like data-loader workers on a busy node):

- ``copy floor``: a copy of every tensor into a preallocated (pinned, on CUDA) host buffer;
- ``raw write``: ``write()`` of every tensor's bytes, then ``fsync``, as a plain program would;
- ``raw direct``: the same bytes through two aligned buffers with ``O_DIRECT`` (one copied while the
  other is written), then ``fsync``: what the disk takes at best;
- ``lightning torch``: Lightning's ``TorchCheckpointIO`` (+ an fsync here: it does none);
- ``lightning async``: Lightning's ``AsyncCheckpointIO`` (a thread over ``TorchCheckpointIO``);
- ``ours sync`` / ``ours async``: ``DurableCheckpointIO(asynchronous=False / True)``;
- ``ours async+s3`` (only with ``--rows``): mirrored to a moto S3 server on loopback;
- ``copy in pieces`` (only with ``--rows``, CPU): the copy floor done the way ours copies (a few
  threads taking 16 MB pieces in turn), for how far the rest of the stall is from a copy.

Columns, each a median over ``--saves`` saves:

- ``stall``: how long ``save_checkpoint`` blocks the training loop, against the copy floor of the same
  load;
- ``first``: the first save, save + wait until durable (writer start-up and buffers included);
- ``paused``: save + wait until durable, training paused: the preemption path;
- ``training``: save, then training steps until the file is durable, and how much slower those
  steps are than steps with nothing in flight (the raw rows write from another process here);
- ``extra RSS``: peak memory of the process and its children (sum of PSS, so shared memory counts
  once) while saving, over training's own peak, relative to the state's size (quiet only, sampled in
  a second, shorter run so that sampling does not slow down the timed one).

Ratios are to the floors measured in the same run under the same load: the stall to ``copy floor``,
times to durable to the faster of ``raw write`` and ``raw direct`` (paused). Then: verified load vs
``torch.load``.
"""

from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROWS = [
    *("copy floor", "raw write", "raw direct"),
    *("lightning torch", "lightning async", "ours sync", "ours async"),
]
OPTIONAL_ROWS = ["ours async+s3", "copy in pieces"]
#: The format step with torch.save instead of our zip writer (``--only format``).
FORMAT_ROWS = ("torch.save sync", "torch.save async")
RAW = ("raw write", "raw direct")
SYNCHRONOUS = ("copy floor", "raw write", "raw direct", "lightning torch", "ours sync")
TARGETS = {
    "ours async paused <= 1.5x floor": ("ours async", "paused", 1.5),
    "ours async training <= 3x floor": ("ours async", "training", 3.0),
    "ours sync <= 1.3x floor": ("ours sync", "paused", 1.3),
}
BLOCK = 8 << 20

# -- the measured process ---------------------------------------------------------------------------


def build(size_mb: int, device: Any) -> tuple[Any, Any, Any]:
    """A stack of linear layers whose weights + Adam moments are about ``size_mb``; one step done."""
    import torch
    from torch import nn

    width = 2048
    layers = max(1, round(size_mb * 2**20 / (3 * 4 * width * width)))
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = torch.randn(16, width, device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(batch).square().mean().backward()
        optimizer.step()

    step()
    return model, optimizer, step


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def state_of(model: Any, optimizer: Any, step: int) -> dict[str, Any]:
    return {
        "state_dict": model.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
        "global_step": step,
        "epoch": 0,
        "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": step}}}},
    }


def state_tensors(model: Any, optimizer: Any) -> list[Any]:
    """The tensors of the checkpoint: weights and optimizer state."""
    import torch

    tensors = list(model.state_dict().values())
    return tensors + [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]


def fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
    fd = os.open(path.parent, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def write_raw(views: list[memoryview], path: Path, direct: bool) -> None:
    """Write ``views`` one after the other to ``path`` and fsync: the disk floor rows."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o644)
    try:
        if not direct:
            for view in views:
                for offset in range(0, view.nbytes, BLOCK):
                    os.write(fd, view[offset : offset + BLOCK])
        else:
            _write_direct(fd, views)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_direct(fd: int, views: list[memoryview]) -> None:
    """Copy into one aligned buffer while the other is written by a thread (pwrite releases the GIL)."""
    buffers = [mmap.mmap(-1, BLOCK) for _ in range(2)]
    io = ThreadPoolExecutor(max_workers=1)
    pending = None
    written = used = current = 0

    def flush(last: bool = False) -> None:
        nonlocal pending, written, used, current
        padded = -(-used // 4096) * 4096
        if pending is not None:
            pending.result()
        pending = io.submit(os.pwrite, fd, memoryview(buffers[current])[:padded], written)
        written, used, current = written + used, 0, 1 - current
        if last:
            pending.result()
            os.ftruncate(fd, written)

    for view in views:
        done = 0
        while done < view.nbytes:
            n = min(BLOCK - used, view.nbytes - done)
            buffers[current][used : used + n] = view[done : done + n]
            used, done = used + n, done + n
            if used == BLOCK:
                flush()
    flush(last=True)
    io.shutdown()


class RawWriterProcess:
    """Another process that writes ``nbytes`` of its own memory (+ fsync) when told to: a raw write
    beside training, for the step slowdown it causes."""

    def __init__(self, nbytes: int, folder: Path, direct: bool) -> None:
        cmd = [sys.executable, __file__, "--raw-helper", str(nbytes), "--dir", str(folder)]
        cmd += ["--direct"] if direct else []
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        assert self.stdout.readline().strip() == "ready"
        self.busy = False

    def start(self) -> None:
        self.stdin.write("go\n")
        self.stdin.flush()
        self.busy = True

    def in_flight(self) -> bool:
        if self.busy and select.select([self.stdout], [], [], 0)[0]:
            assert self.stdout.readline().strip() == "done"
            self.busy = False
        return self.busy

    def wait(self) -> None:
        while self.in_flight():
            time.sleep(0.001)

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait()


def raw_helper(nbytes: int, folder: Path, direct: bool) -> None:
    """The body of :class:`RawWriterProcess` (this file run with ``--raw-helper``)."""
    data = mmap.mmap(-1, nbytes)
    block = os.urandom(min(BLOCK, nbytes))
    for offset in range(0, nbytes, len(block)):
        data[offset : offset + len(block)] = block[: nbytes - offset]
    view = memoryview(data)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "go":
            write_raw([view], folder / "raw-other.bin", direct)
            print("done", flush=True)


class Watcher(threading.Thread):
    """Notes when ``running()`` turns false, so that a training step in progress then does not count."""

    def __init__(self, running: Callable[[], bool]) -> None:
        super().__init__(daemon=True)
        self.running = running
        self.ended = 0.0
        self.start()

    def run(self) -> None:
        while self.running():
            time.sleep(0.002)
        self.ended = time.perf_counter()


Plugin = tuple[Callable[[Any, Path], None], Callable[[Path], None], Callable[[], bool]]


def plugin(row: str, endpoint: str | None) -> Plugin:
    """``(save(checkpoint, path), wait_durable(path), in_flight())`` for a checkpoint plugin row."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    from lightning_resume import DurableCheckpointIO, Mirror

    if row == "lightning torch":
        torch_io = TorchCheckpointIO()
        return torch_io.save_checkpoint, fsync_file, lambda: False
    if row == "lightning async":
        done = threading.Event()

        class Signalling(TorchCheckpointIO):
            def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
                super().save_checkpoint(*args, **kwargs)
                done.set()

        async_io = AsyncCheckpointIO(Signalling())

        def save(checkpoint: Any, path: Path) -> None:
            done.clear()
            async_io.save_checkpoint(checkpoint, path)

        def durable(path: Path) -> None:
            done.wait()
            fsync_file(path)

        return save, durable, lambda: not done.is_set()
    if row in FORMAT_ROWS:
        return torch_save_route(row == "torch.save async")
    options: dict[str, Any] = {"asynchronous": row != "ours sync"}
    if row == "ours async+s3":
        options.update(
            mirror=Mirror(
                "s3://bench/run",
                {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}},
                wait=False,
            ),
        )
    ours = DurableCheckpointIO(**options)
    return ours.save_checkpoint, lambda _: ours.wait_until_durable(), lambda: ours.busy


def torch_save_route(behind: bool) -> Plugin:
    """``torch.save`` as the format step of our route, into the same reused buffer and file (``WriteNow``:
    writer, then commit); ``behind``: the tensors copied out first (buffers allocated once), then
    ``torch.save`` of the copies in a thread, as an asynchronous route would with torch's own writer."""
    import torch

    from lightning_resume.io.routes import WriteNow

    route = WriteNow(direct=True, keep=None)
    route._format = torch.save  # type: ignore[assignment]

    def now(checkpoint: Any, path: Path) -> None:
        route.save(checkpoint, path, {"saved_at": time.time()}, lambda: None, lambda *_: None)

    if not behind:
        return now, lambda _: None, lambda: False
    buffers: dict[tuple[Any, ...], Any] = {}
    pool = ThreadPoolExecutor(max_workers=1)
    pending: list[Any] = []

    def copied(obj: Any, key: tuple[Any, ...]) -> Any:
        if isinstance(obj, torch.Tensor):
            if key not in buffers:
                buffers[key] = torch.empty_like(obj, device="cpu")
            return buffers[key].copy_(obj)
        if isinstance(obj, dict):
            return {k: copied(v, (*key, k)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(copied(v, (*key, i)) for i, v in enumerate(obj))
        return obj

    def wait(_: Any = None) -> None:
        while pending:
            pending.pop().result()

    def save(checkpoint: Any, path: Path) -> None:
        wait()
        pending.append(pool.submit(now, copied(checkpoint, ()), path))

    return save, wait, lambda: bool(pending) and not pending[-1].done()


def saver(
    row: str, tensors: list[Any], device: Any, folder: Path, endpoint: str | None, helper_process: bool
) -> tuple[Plugin, RawWriterProcess | None]:
    """The ``(save, wait_durable, in_flight)`` of ``row``, and for a raw row measured while training,
    the process that writes beside it."""
    import torch

    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    if row == "copy floor":
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
        buffer.fill_(0)  # preallocated: the pages exist before the first copy

        def copy(checkpoint: Any, path: Path) -> None:
            offset = 0
            for t in tensors:
                n = t.numel() * t.element_size()
                buffer[offset : offset + n].copy_(t.detach().reshape(-1).view(torch.uint8), non_blocking=True)
                offset += n
            sync(device)

        return (copy, lambda _: None, lambda: False), None
    if row == "copy in pieces" and device.type == "cpu":
        from lightning_resume.io.snapshot import copy_regions

        buffer = torch.empty(nbytes, dtype=torch.uint8)
        buffer.fill_(0)

        def pieces(checkpoint: Any, path: Path) -> None:
            regions, offset = [], buffer.data_ptr()
            for t in tensors:
                n = t.numel() * t.element_size()
                regions.append((offset, t.data_ptr(), n))
                offset += n
            copy_regions(regions, threads=min(torch.get_num_threads(), 4))

        return (pieces, lambda _: None, lambda: False), None
    if row in RAW:
        direct = row == "raw direct"

        def raw(checkpoint: Any, path: Path) -> None:
            views = [memoryview(t.detach().cpu().reshape(-1).view(torch.uint8).numpy()) for t in tensors]
            write_raw(views, path, direct)

        helper = RawWriterProcess(nbytes, folder, direct) if helper_process else None
        return (raw, lambda _: None, lambda: False), helper
    return plugin(row, endpoint), None


def measure(
    row: str,
    size_mb: int,
    saves: int,
    training_saves: int,
    folder: Path,
    endpoint: str | None,
    idle_steps: int,
) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, optimizer, step = build(size_mb, device)
    tensors = state_tensors(model, optimizer)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)

    def timed_step() -> float:
        start = time.perf_counter()
        step()
        sync(device)
        return time.perf_counter() - start

    (save, durable, in_flight), helper = saver(row, tensors, device, folder, endpoint, training_saves > 0)
    for _ in range(2):  # warm-up: the first steps allocate (gradients, optimizer temporaries)
        timed_step()
    print("PHASE idle", flush=True)
    time.sleep(0.2)
    idle = [timed_step() for _ in range(idle_steps)]
    print("PHASE saving", flush=True)
    path = folder / "last.ckpt"

    def one_save(i: int) -> tuple[float, float]:
        checkpoint = state_of(model, optimizer, i)
        sync(device)
        start = time.perf_counter()
        save(checkpoint, path)
        stall = time.perf_counter() - start
        del checkpoint
        durable(path)
        return stall, time.perf_counter() - start

    first = one_save(0)[1]
    stalls, paused = [], []
    for i in range(saves):
        stall, done = one_save(1 + i)
        stalls.append(stall)
        paused.append(done)
        idle += [timed_step() for _ in range(2)]
    training, busy_steps = [], []
    if training_saves and helper is None and row not in SYNCHRONOUS:
        # Unmeasured: a wait (above) makes the next write run at full speed; this one takes that turn.
        save(state_of(model, optimizer, 99), path)
        while in_flight():
            timed_step()
        durable(path)
    for i in range(training_saves if row not in SYNCHRONOUS or helper is not None else 0):
        checkpoint = state_of(model, optimizer, 100 + i)
        sync(device)
        start = time.perf_counter()
        if helper is not None:
            helper.start()
            running = helper.in_flight
        else:
            save(checkpoint, path)
            running = in_flight
        del checkpoint
        watcher = Watcher(running)
        while watcher.is_alive():
            busy_steps.append(timed_step())
        rest = time.perf_counter()
        if helper is None:
            durable(path)  # Lightning's rows: the fsync done here; ours: returns at once
        training.append(watcher.ended - start + time.perf_counter() - rest)
        idle += [timed_step() for _ in range(3)]
    if helper is not None:
        helper.close()
    print("PHASE done", flush=True)
    return {
        "nbytes": nbytes,
        "first": first,
        "stalls": stalls,
        "paused": paused,
        "training": training,
        "idle_step": statistics.median(idle),
        "busy_step": statistics.median(busy_steps) if busy_steps else None,
        "busy_steps": len(busy_steps),
        "device": str(device),
    }


class PhaseLog(logging.Handler):
    """Keeps the staging phases ``DurableCheckpointIO`` logs at DEBUG (``io/snapshot.py``; before issue 42
    ``io/_snapshot.py``, for runs against an older checkout)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.phases: list[dict[str, float]] = []
        for name in ("lightning_resume.io.snapshot", "lightning_resume.io._snapshot"):
            logger = logging.getLogger(name)
            logger.setLevel(logging.DEBUG)
            logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        phases = getattr(record, "phases", None)
        if phases is not None:
            self.phases.append(phases)


def measure_stalls(rows: list[str], size_mb: int, saves: int, folder: Path) -> dict[str, Any]:
    """The stall of each of ``rows``, in one process, taking turns save by save (the same machine load
    for all), and the staging phases of ours."""
    import torch

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, optimizer, step = build(size_mb, device)
    tensors = state_tensors(model, optimizer)
    phases = PhaseLog()
    plugins = {row: saver(row, tensors, device, folder, None, False)[0] for row in rows}
    path = folder / "last.ckpt"
    stalls: dict[str, list[float]] = {row: [] for row in rows}
    for i in range(saves + 1):  # the first save of each row (buffers, writer start-up) is not counted
        order = rows[i % len(rows) :] + rows[: i % len(rows)]  # no row always right after another
        for row in order:
            save, durable, _ = plugins[row]
            checkpoint = state_of(model, optimizer, i)
            sync(device)
            start = time.perf_counter()
            save(checkpoint, path)
            stall = time.perf_counter() - start
            del checkpoint
            durable(path)
            if i:
                stalls[row].append(stall)
            step()
            sync(device)
    return {
        "nbytes": sum(t.numel() * t.element_size() for t in tensors),
        "stalls": stalls,
        "phases": phases.phases[1:],
        "device": str(device),
    }


def measure_turns(rows: list[str], size_mb: int, saves: int, folder: Path) -> dict[str, Any]:
    """Each of ``rows`` saving in turn in one process (the same machine load for all): the stall and the
    time until durable with training paused (the preemption path), save by save."""
    import torch

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, optimizer, step = build(size_mb, device)
    tensors = state_tensors(model, optimizer)
    plugins = {row: saver(row, tensors, device, folder, None, False)[0] for row in rows}
    stalls: dict[str, list[float]] = {row: [] for row in rows}
    durable: dict[str, list[float]] = {row: [] for row in rows}
    for i in range(saves + 1):  # the first save of each row (buffers, writer start-up) is not counted
        for row in rows[i % len(rows) :] + rows[: i % len(rows)]:
            save, wait, _ = plugins[row]
            path = folder / f"{row.replace(' ', '-')}.ckpt"
            checkpoint = state_of(model, optimizer, i)
            sync(device)
            start = time.perf_counter()
            save(checkpoint, path)
            stall = time.perf_counter() - start
            del checkpoint
            wait(path)
            if i:
                stalls[row].append(stall)
                durable[row].append(time.perf_counter() - start)
            step()
            sync(device)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return {"nbytes": nbytes, "stalls": stalls, "durable": durable, "device": str(device)}


def run_turns(rows: list[str], size: int, saves: int, tree: str | None) -> dict[str, Any]:
    """:func:`measure_turns` in a process of its own, importing ``lightning_resume`` from ``tree``."""
    folder = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=os.environ.get("BENCH_DIR")))
    cmd = [sys.executable, __file__, "--child", ",".join(rows), "--sizes", str(size), "--saves", str(saves)]
    cmd += ["--dir", str(folder), "--only", "turns"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([tree, *filter(None, [env.get("PYTHONPATH")])])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])


def report_turns(
    runs: dict[tuple[int, int, str], list[dict[str, Any]]], rows: list[str], floors: tuple[str, str]
) -> None:
    """Per size and load, each row (of each tree): median stall and time to durable over the repeats
    (each repeat: the median of its saves), against the copy floor and the disk floor of its runs."""
    copy_row, disk_row = floors
    for size, load in sorted({(s, lo) for s, lo, _ in runs}):
        trees = [t for s, lo, t in runs if (s, lo) == (size, load)]
        first = runs[(size, load, trees[0])][0]
        where = "quiet" if load == 0 else f"{load} busy processes"
        repeats = len(runs[(size, load, trees[0])])
        print(f"\n### {first['nbytes'] / 2**30:.2f} GiB state, {where}, medians of {repeats} runs\n")
        print("| row | stall ms | x copy floor | durable s | x disk floor |\n|---|---|---|---|---|")
        for tree in trees:
            results = runs[(size, load, tree)]

            def med(kind: str, row: str, results: list[dict[str, Any]] = results) -> float | None:
                return median([statistics.median(r[kind][row]) for r in results if r[kind].get(row)])

            copy, disk = med("stalls", copy_row), med("durable", disk_row)
            for row in rows:
                if row in floors:
                    continue
                stall, durable = med("stalls", row), med("durable", row)
                name = f"{row} ({tree})" if tree else row
                print(
                    f"| {name} | {milliseconds(stall)} | {ratio(stall, copy)} | {seconds(durable)} | "
                    f"{ratio(durable, disk)} |"
                )
            label = tree or "this checkout"
            print(f"| floors ({label}) | copy {milliseconds(copy)} | | disk {seconds(disk)} | |")


def load_benchmark(size_mb: int, folder: Path, repeats: int) -> dict[str, float]:
    import torch

    from lightning_resume import DurableCheckpointIO

    model, optimizer, _ = build(size_mb, torch.device("cpu"))
    path = folder / "load.ckpt"
    ours = DurableCheckpointIO(asynchronous=False)
    ours.save_checkpoint(state_of(model, optimizer, 1), path)
    del model, optimizer
    plain, verified = [], []
    for _ in range(repeats):  # alternate, so both see the same page cache and machine load
        start = time.perf_counter()
        torch.load(path, map_location="cpu", weights_only=True)
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        ours.load_checkpoint(path, weights_only=True)
        verified.append(time.perf_counter() - start)
    return {"torch.load": statistics.median(plain), "verified": statistics.median(verified)}


# -- the driver ------------------------------------------------------------------------------------


def tree_pss_mb(pid: int) -> float:
    """Proportional set size of ``pid`` and its descendants (shared pages counted once)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{current}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total / 1024


def run_child(
    row: str,
    size_mb: int,
    saves: int,
    training_saves: int,
    endpoint: str | None,
    sample: bool,
    stalls_only: bool = False,
) -> dict[str, Any]:
    """Run one row in its own process; with ``sample``, also its extra peak memory while saving.

    The memory run trains longer before saving, so that the peak "without saves" includes the
    training's own ups and downs, and gives large allocations back to the system when freed (glibc
    otherwise keeps some in its heap as it likes: the training's footprint would drift by tens of
    MB for reasons that have nothing to do with saving).
    """
    folder = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=os.environ.get("BENCH_DIR")))
    cmd = [sys.executable, __file__, "--child", row, "--sizes", str(size_mb), "--saves", str(saves)]
    cmd += ["--training-saves", str(training_saves), "--idle-steps", "30" if sample else "6"]
    cmd += ["--dir", str(folder)] + (["--endpoint", endpoint] if endpoint else [])
    cmd += ["--only", "stall"] if stalls_only else []
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if sample:
        env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    # Peak memory while training without saves, then while saving: the difference is what saving costs.
    peaks = {"idle": 0.0, "saving": 0.0}
    phase: list[str] = []

    def sample_memory() -> None:
        while phase[-1] != "done":
            peaks[phase[-1]] = max(peaks[phase[-1]], tree_pss_mb(proc.pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample_memory, daemon=True)
    result: dict[str, Any] = {}
    for line in proc.stdout:
        if line.startswith("PHASE "):
            phase.append(line.split()[1])
            if phase == ["idle"] and sample:
                sampler.start()
        elif line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
    proc.wait()
    phase.append("done")
    shutil.rmtree(folder, ignore_errors=True)
    if proc.returncode != 0 or not result:
        raise RuntimeError(f"row {row!r} ({size_mb} MB) failed with status {proc.returncode}")
    result["extra_mb"] = max(0.0, peaks["saving"] - peaks["idle"])
    return result


@contextmanager
def busy_processes(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU (nice 0) while the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    )
    for _ in range(100):
        try:
            client.create_bucket(Bucket="bench")
            return server, endpoint
        except Exception:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("the moto server did not start")


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def ratio(value: float | None, floor: float | None) -> str:
    return "-" if value is None or not floor else f"{value / floor:.2f}x"


def slowdown(r: dict[str, Any]) -> float | None:
    return None if r["busy_step"] is None else r["busy_step"] / r["idle_step"] - 1


def floors(results: dict[tuple[int, int, str], dict[str, Any]], size: int, load: int) -> tuple[Any, Any, Any]:
    """``(copy floor stall, disk floor seconds, raw-write-beside-training slowdown)`` for a size and load."""
    copy = results.get((size, load, "copy floor"))
    raws = [results[(size, load, row)] for row in RAW if (size, load, row) in results]
    disk = min((statistics.median(r["paused"]) for r in raws if r["paused"]), default=None)
    slowdowns = [s for s in (slowdown(r) for r in raws) if s is not None]
    return median(copy["stalls"]) if copy else None, disk, min(slowdowns, default=None)


def report(
    results: dict[tuple[int, int, str], dict[str, Any]],
    memory: dict[tuple[int, str], float],
    loads: list[int],
    verified: dict[int, dict[str, float]],
) -> None:
    """Markdown tables: one per state size, the load levels side by side."""
    sizes = sorted({s for s, _, _ in results})
    rows = list(dict.fromkeys(row for _, _, row in results))
    device = next(iter(results.values()))["device"]
    for size in sizes:
        nbytes = next(r["nbytes"] for (s, _, _), r in results.items() if s == size)
        print(f"\n### {nbytes / 2**30:.2f} GiB state ({device})\n")
        header = ["row"]
        for load in loads:
            where = "quiet" if load == 0 else f"{load} busy"
            header += [f"{where}: stall ms (x copy)", f"{where}: first s", f"{where}: paused s (x floor)"]
            header += [f"{where}: training s (x floor), step"]
        header += ["extra RSS x state"]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            if (size, 0, row) not in results:
                continue
            cells = [row]
            for load in loads:
                r = results.get((size, load, row))
                if r is None:
                    cells += ["-", "-", "-", "-"]
                    continue
                copy_floor, disk, _ = floors(results, size, load)
                stall = median(r["stalls"])
                cells.append(
                    f"{stall * 1000:,.0f} ({ratio(stall, copy_floor)})" if stall is not None else "-"
                )
                paused, training, slow = median(r["paused"]), median(r["training"]), slowdown(r)
                cells.append(seconds(r["first"]) if row != "copy floor" else "-")
                cells.append(f"{seconds(paused)} ({ratio(paused, disk)})" if row != "copy floor" else "-")
                step = f"{slow:+.0%} ({r['busy_steps']})" if slow is not None else "-"
                cells.append(f"{seconds(training)} ({ratio(training, disk)}), {step}" if training else "-")
            extra = memory.get((size, row))
            cells.append(f"{extra * 2**20 / nbytes:.2f}" if extra is not None else "-")
            print("| " + " | ".join(cells) + " |")
        print()
        for load in loads:
            copy, disk, raw_slow = floors(results, size, load)
            where = "quiet" if load == 0 else f"{load} busy processes"
            checks = {}
            for name, (row, column, limit) in TARGETS.items():
                r = results.get((size, load, row))
                value = median(r[column]) if r else None
                if value is not None and disk:
                    checks[name] = f"{value / disk:.2f}x {'ok' if value <= limit * disk else 'MISSED'}"
            ours = results.get((size, load, "ours async"))
            ours_slow = slowdown(ours) if ours else None
            if ours_slow is not None and raw_slow is not None:
                ok = ours_slow <= raw_slow + 0.10
                checks["step slowdown <= raw write's + 10 points"] = (
                    f"{ours_slow:+.0%} vs {raw_slow:+.0%} {'ok' if ok else 'MISSED'}"
                )
            if ours and copy:
                stall = median(ours["stalls"])
                assert stall is not None
                verdict = "ok" if stall <= 1.5 * copy else "MISSED"
                checks["stall <= 1.5x copy floor"] = f"{stall / copy:.2f}x {verdict}"
            if load == 0 and (size, "ours async") in memory:
                extra = memory[(size, "ours async")] * 2**20 / nbytes
                checks["extra RSS <= 1.2x state"] = f"{extra:.2f} {'ok' if extra <= 1.2 else 'MISSED'}"
            listed = "; ".join(f"{k}: {v}" for k, v in checks.items())
            print(f"- targets, {where} (floor {seconds(disk)} s): {listed}")
    print(
        "\nstall: how long save_checkpoint blocks training, against the copy floor of the same load. "
        "floor: the faster of raw write and raw direct, paused, same size and load. paused: save + wait "
        "until durable with training paused (the preemption path). training: save, then training steps "
        "until durable (raw rows: written by another process), and the median step time then against "
        "steps with nothing in flight (number of such steps in brackets). first: the first save, "
        "paused (process and buffer start-up included)."
    )
    if verified:
        print("\n| state | torch.load s | verify + load s | ratio (target <= 1.2) |\n|---|---|---|---|")
        for size, v in verified.items():
            plain, checked = v["torch.load"], v["verified"]
            print(f"| {size} MB | {plain:.2f} | {checked:.2f} | {checked / plain:.2f} |")


def report_stalls(runs: dict[tuple[int, int], list[dict[str, Any]]], rows: list[str]) -> None:
    """One table of stalls per state size: each row against the copy floor, load by load."""
    others = [row for row in rows if row != "copy floor"]
    for size in sorted({size for size, _ in runs}):
        loads = sorted(load for s, load in runs if s == size)
        first = runs[(size, loads[0])]
        count = sum(len(r["stalls"][rows[0]]) for r in first)
        gib = first[0]["nbytes"] / 2**30
        print(f"\n### Stall, {gib:.2f} GiB state ({first[0]['device']}), medians of {count} saves per load\n")
        header = [
            "load",
            *(f"{row} ms" for row in rows),
            *(f"{row} x floor (each process)" for row in others),
        ]
        header.append("staging phases of ours async, ms")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        checks = []
        for load in loads:
            results = runs[(size, load)]
            stalls = {row: median([x for r in results for x in r["stalls"][row]]) for row in rows}
            cells = ["quiet" if load == 0 else f"{load} busy"]
            cells += [milliseconds(stalls[row]) for row in rows]
            for row in others:
                each = [
                    ratio(median(r["stalls"][row]), median(r["stalls"].get("copy floor", [])))
                    for r in results
                ]
                cells.append(f"{ratio(stalls[row], stalls.get('copy floor'))} ({', '.join(each)})")
            cells.append(describe_phases([p for r in results for p in r["phases"]]))
            print("| " + " | ".join(cells) + " |")
            ours, floor = stalls.get("ours async"), stalls.get("copy floor")
            if ours is not None and floor:
                where = "quiet" if load == 0 else f"{load} busy processes"
                checks.append(f"{where} {ours / floor:.2f}x {'ok' if ours <= 1.5 * floor else 'MISSED'}")
        if checks:
            print(
                f"\n- target, ours async stall <= 1.5x the copy floor of the same load: {'; '.join(checks)}"
            )
    print(
        "\nEach process measures every row, taking turns save by save, so that the rows see the same "
        "machine load; the first save of each row (buffers, writer start-up) is not counted."
    )


def describe_phases(phases: list[dict[str, float]]) -> str:
    """Median milliseconds of each staging phase, e.g. ``plan 1, copy 70, views 2, pickle 4``."""
    names = list(dict.fromkeys(name for p in phases for name in p))
    return (
        ", ".join(f"{n} {statistics.median(p[n] for p in phases if n in p) * 1000:.0f}" for n in names) or "-"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1024,4096", help="state sizes in MB, comma-separated")
    parser.add_argument("--load", type=int, default=2, help="busy processes in the loaded runs (0: none)")
    parser.add_argument("--saves", type=int, default=3, help="measured saves per column (after the first)")
    parser.add_argument(
        "--rows", default=None, help=f"comma-separated, of {ROWS + OPTIONAL_ROWS} (default: all of the first)"
    )
    parser.add_argument(
        "--only",
        choices=["stall", "format", "compare", "turns"],
        default=None,
        help="stall: only the stall, rows (default: copy floor, ours async) taking turns in each process; "
        "format: our zip writer against torch.save as the format step (stall and time to durable); "
        "compare: stall and time to durable of checkouts side by side (--trees)",
    )
    parser.add_argument(
        "--trees",
        default=None,
        help="with --only compare: name=path,... (e.g. before=/work/before,after=.), each run importing "
        "lightning_resume from its path, taking turns",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="with --only stall: processes per size and load"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the extra-RSS runs")
    parser.add_argument("--no-verified-load", action="store_true", help="skip verify + load vs torch.load")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--raw-helper", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--direct", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--idle-steps", type=int, default=6, help=argparse.SUPPRESS)
    parser.add_argument("--training-saves", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.raw_helper is not None:
        raw_helper(args.raw_helper, Path(args.dir), args.direct)
        return
    if args.child is not None:
        training = args.saves if args.training_saves is None else args.training_saves
        folder, endpoint = Path(args.dir), args.endpoint
        if args.only == "turns":
            result = measure_turns(args.child.split(","), sizes[0], args.saves, folder)
        elif args.only == "stall":
            result = measure_stalls(args.child.split(","), sizes[0], args.saves, folder)
        else:
            result = measure(args.child, sizes[0], args.saves, training, folder, endpoint, args.idle_steps)
        print("RESULT " + json.dumps(result), flush=True)
        return
    if args.only in ("format", "compare"):
        turn_floors = ("copy floor", "raw direct")
        if args.only == "format":
            default = [*turn_floors, "ours sync", "torch.save sync", "ours async", "torch.save async"]
            trees: list[tuple[str, str | None]] = [("", None)]
        else:
            default = [*turn_floors, "ours sync", "ours async"]
            if not args.trees:
                parser.error("--only compare needs --trees name=path,...")
            trees = [(n, str(Path(p).resolve())) for n, p in (t.split("=", 1) for t in args.trees.split(","))]
        chosen = [r.strip() for r in args.rows.split(",")] if args.rows else default
        turns: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
        for size in sizes:
            for load in [0] + ([args.load] if args.load > 0 else []):
                with busy_processes(load):
                    for repeat in range(args.repeats):
                        # Taking turns, in another order each repeat: the same noise for every checkout.
                        for name, tree in trees[repeat % len(trees) :] + trees[: repeat % len(trees)]:
                            print(
                                f"{args.only} {size} MB, load {load}, run {repeat + 1} {name}",
                                file=sys.stderr,
                            )
                            result = run_turns(chosen, size, args.saves, tree)
                            turns.setdefault((size, load, name), []).append(result)
        report_turns(turns, chosen, turn_floors)
        return
    default_rows = ["copy floor", "ours async"] if args.only == "stall" else ROWS
    rows = [r.strip() for r in args.rows.split(",")] if args.rows else default_rows
    loads = [0] + ([args.load] if args.load > 0 else [])
    if args.only == "stall":
        if "ours async+s3" in rows:
            parser.error("--only stall measures local saves; leave out 'ours async+s3'")
        runs: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for size in sizes:
            for load in loads:
                with busy_processes(load):
                    for repeat in range(args.repeats):
                        print(
                            f"stalls at {size} MB, load {load}, run {repeat + 1} ...",
                            file=sys.stderr,
                            flush=True,
                        )
                        result = run_child(",".join(rows), size, args.saves, 0, None, False, stalls_only=True)
                        runs.setdefault((size, load), []).append(result)
        report_stalls(runs, rows)
        return
    server, endpoint = start_moto() if "ours async+s3" in rows else (None, None)
    results: dict[tuple[int, int, str], dict[str, Any]] = {}
    memory: dict[tuple[int, str], float] = {}
    verified: dict[int, dict[str, float]] = {}
    try:
        for size in sizes:
            for load in loads:
                with busy_processes(load):
                    for row in rows:
                        print(f"measuring {row} at {size} MB, load {load} ...", file=sys.stderr, flush=True)
                        result = run_child(row, size, args.saves, args.saves, endpoint, False)
                        results[(size, load, row)] = result
            for row in [] if args.no_memory else rows:
                print(f"memory of {row} at {size} MB ...", file=sys.stderr, flush=True)
                memory[(size, row)] = run_child(row, size, 1, 0, endpoint, True)["extra_mb"]
            if not args.no_verified_load:
                folder = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=os.environ.get("BENCH_DIR")))
                verified[size] = load_benchmark(size, folder, repeats=5)
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        if server is not None:
            server.kill()
    report(results, memory, loads, verified)


if __name__ == "__main__":
    main()
