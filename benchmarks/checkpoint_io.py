"""Checkpoint plugins side by side: DurableCheckpointIO against Lightning's plugins and a memory copy.

Run: ``python benchmarks/checkpoint_io.py`` (``--sizes 256`` for a quick run, ``--saves N``).

For a model + Adam state of ~256 MB and ~1 GB (on the GPU when there is one, else the CPU) each row
runs in its own process, saving the state several times between training steps:

- ``floor``: a copy of every tensor into a preallocated (pinned, on CUDA) host buffer;
- ``lightning torch``: Lightning's ``TorchCheckpointIO``;
- ``lightning async``: Lightning's ``AsyncCheckpointIO`` (a thread over ``TorchCheckpointIO``);
- ``ours sync`` / ``ours async``: ``DurableCheckpointIO(asynchronous=False / True)``;
- ``ours async+s3``: ``DurableCheckpointIO`` mirrored to a moto S3 server on loopback (its own process).

Columns: the training-loop stall per save (median, p95) after one warm-up save; the time until the
file is durable (Lightning's plugins do not fsync: the time includes an fsync done here); the step
time while a write (or, for the mirror, an upload) is in flight relative to steps with nothing in
flight; the extra peak memory of the process and its children (sum of PSS, so shared memory counts
once) over the state's size, sampled in a second, shorter run so that sampling does not slow down
the timed one. Then: verified load vs ``torch.load``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROWS = ["floor", "lightning torch", "lightning async", "ours sync", "ours async", "ours async+s3"]
TARGETS = (
    "ours async: stall <= 1.5x floor, <= 0.1x lightning torch, < lightning async; step +<=15%; RSS <= 1.2x"
)


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


def plugin(row: str, endpoint: str | None) -> tuple[Any, Any, Any]:
    """``(save(checkpoint, path), wait_durable(path), in_flight())`` for a row."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    from lightning_resume import DurableCheckpointIO

    def fsync(path: Path) -> None:
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        fd = os.open(path.parent, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    if row == "lightning torch":
        torch_io = TorchCheckpointIO()
        return torch_io.save_checkpoint, fsync, lambda: False
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
            fsync(path)

        return save, durable, lambda: not done.is_set()
    options: dict[str, Any] = {"asynchronous": row != "ours sync"}
    if row == "ours async+s3":
        options.update(
            mirror="s3://bench/run",
            mirror_options={"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}},
            wait_for_mirror=False,
        )
    ours = DurableCheckpointIO(**options)
    if row == "ours async+s3":
        return ours.save_checkpoint, lambda _: ours.wait_until_durable(), lambda: ours.mirroring
    return ours.save_checkpoint, lambda _: ours.wait_until_durable(), lambda: ours.writing


def measure(
    row: str, size_mb: int, saves: int, folder: Path, endpoint: str | None, idle_steps: int
) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, optimizer, step = build(size_mb, device)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v)
    )

    def timed_step() -> float:
        start = time.perf_counter()
        step()
        sync(device)
        return time.perf_counter() - start

    if row == "floor":
        tensors = [t for t in state_of(model, optimizer, 0)["state_dict"].values()]
        tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
        buffer.fill_(0)  # preallocated: the pages exist before the first copy

        def copy(checkpoint: Any, path: Path) -> None:
            offset = 0
            for t in tensors:
                n = t.numel() * t.element_size()
                buffer[offset : offset + n].copy_(t.detach().reshape(-1).view(torch.uint8), non_blocking=True)
                offset += n
            sync(device)

        save, durable, in_flight = copy, (lambda _: None), (lambda: False)
    else:
        save, durable, in_flight = plugin(row, endpoint)
    for _ in range(2):  # warm-up: the first steps allocate (gradients, optimizer temporaries)
        timed_step()
    print("PHASE idle", flush=True)
    time.sleep(0.2)
    idle = [timed_step() for _ in range(idle_steps)]
    print("PHASE saving", flush=True)
    stalls, durables, busy_steps = [], [], []
    for i in range(saves + 1):
        path = folder / "last.ckpt"
        checkpoint = state_of(model, optimizer, i)
        sync(device)
        start = time.perf_counter()
        save(checkpoint, path)
        stall = time.perf_counter() - start
        del checkpoint
        steps = []
        while in_flight():
            steps.append(timed_step())
        durable(path)
        done = time.perf_counter() - start
        if i > 0:  # the first save allocates buffers and starts processes
            stalls.append(stall)
            durables.append(done)
            busy_steps += steps
        idle += [timed_step() for _ in range(3)]
    print("PHASE done", flush=True)
    return {
        "nbytes": nbytes,
        "stalls": stalls,
        "durables": durables,
        "idle_step": statistics.median(idle),
        "busy_step": statistics.median(busy_steps) if busy_steps else None,
        "busy_steps": len(busy_steps),
        "device": str(device),
    }


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


def run_child(row: str, size_mb: int, saves: int, endpoint: str | None, sample: bool) -> dict[str, Any]:
    """Run one row in its own process; with ``sample``, also its extra peak memory while saving.

    The memory run trains longer before saving, so that the peak "without saves" includes the
    training's own ups and downs, and gives large allocations back to the system when freed (glibc
    otherwise keeps some in its heap as it likes: the training's footprint would drift by tens of
    MB for reasons that have nothing to do with saving).
    """
    folder = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=os.environ.get("BENCH_DIR")))
    cmd = [sys.executable, __file__, "--child", row, "--sizes", str(size_mb), "--saves", str(saves)]
    cmd += ["--idle-steps", "30" if sample else "6"]
    cmd += ["--dir", str(folder)] + (["--endpoint", endpoint] if endpoint else [])
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


def run_row(row: str, size_mb: int, saves: int, endpoint: str | None) -> dict[str, Any]:
    """Time a row, then measure its memory in a second run.

    Reading ``/proc/<pid>/smaps_rollup`` every 10 ms costs a good part of a core; on a small machine
    that would slow down the very steps and saves being timed, so timing runs without it.
    """
    result = run_child(row, size_mb, saves, endpoint, sample=False)
    result["extra_mb"] = run_child(row, size_mb, 2, endpoint, sample=True)["extra_mb"]
    return result


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


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f}"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(results: dict[tuple[int, str], dict[str, Any]], loads: dict[int, dict[str, float]]) -> None:
    header = (
        f"{'state':>7} {'row':<16} {'stall ms (med)':>14} {'(p95)':>7} {'x floor':>8} {'durable ms':>11} "
        f"{'step in flight':>15} {'extra RSS MB':>13} {'x state':>8}"
    )
    print(header)
    print("-" * len(header))
    for (size, row), r in results.items():
        floor = statistics.median(results[(size, "floor")]["stalls"]) if (size, "floor") in results else None
        stall = statistics.median(r["stalls"])
        slowdown = (
            f"{r['busy_step'] / r['idle_step'] - 1:+.0%} ({r['busy_steps']})"
            if r["busy_step"] is not None
            else "-"
        )
        print(
            f"{r['nbytes'] / 2**20:>5.0f}MB {row:<16} {ms(stall):>14} {ms(quantile(r['stalls'], 0.95)):>7} "
            f"{(f'{stall / floor:.2f}' if floor else '-'):>8} "
            f"{(ms(statistics.median(r['durables'])) if row != 'floor' else '-'):>11} {slowdown:>15} "
            f"{r['extra_mb']:>13,.0f} {r['extra_mb'] * 2**20 / r['nbytes']:>8.2f}"
        )
    print("\n(step in flight: median step time while a save is being written, or uploaded for +s3, against")
    print(f" steps with nothing in flight; in brackets the number of such steps. Device: {r['device']}.)")
    print(f"Targets: {TARGETS}")
    for size in sorted({s for s, _ in results}):
        get = {row: statistics.median(results[(size, row)]["stalls"]) for s, row in results if s == size}
        if {"floor", "lightning torch", "lightning async", "ours async"} <= set(get):
            ours = results[(size, "ours async")]
            checks = {
                "stall <= 1.5x floor": get["ours async"] <= 1.5 * get["floor"],
                "stall <= 0.1x lightning torch": get["ours async"] <= 0.1 * get["lightning torch"],
                "stall < lightning async": get["ours async"] < get["lightning async"],
                "step +<=15%": ours["busy_step"] is None or ours["busy_step"] <= 1.15 * ours["idle_step"],
                "RSS <= 1.2x": ours["extra_mb"] * 2**20 <= 1.2 * ours["nbytes"],
            }
            print(f"  {size} MB: " + ", ".join(f"{k}: {'ok' if v else 'MISSED'}" for k, v in checks.items()))
    print(f"\n{'state':>7} {'torch.load ms':>14} {'verify+load ms':>15} {'ratio':>6}   (target <= 1.2)")
    for size, load in loads.items():
        print(
            f"{size:>5}MB {ms(load['torch.load']):>14} {ms(load['verified']):>15} "
            f"{load['verified'] / load['torch.load']:>6.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="256,1024", help="state sizes in MB, comma-separated")
    parser.add_argument("--saves", type=int, default=5, help="measured saves per row (after one warm-up)")
    parser.add_argument("--rows", default=",".join(ROWS), help="rows to run, comma-separated")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--idle-steps", type=int, default=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child is not None:
        result = measure(args.child, sizes[0], args.saves, Path(args.dir), args.endpoint, args.idle_steps)
        print("RESULT " + json.dumps(result), flush=True)
        return
    rows = [r.strip() for r in args.rows.split(",")]
    server, endpoint = start_moto() if "ours async+s3" in rows else (None, None)
    results: dict[tuple[int, str], dict[str, Any]] = {}
    loads: dict[int, dict[str, float]] = {}
    try:
        for size in sizes:
            saves = args.saves if size <= 512 else max(2, args.saves - 2)
            for row in rows:
                print(f"measuring {row} at {size} MB ...", file=sys.stderr, flush=True)
                results[(size, row)] = run_row(row, size, saves, endpoint)
            folder = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=os.environ.get("BENCH_DIR")))
            loads[size] = load_benchmark(size, folder, repeats=5)
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        if server is not None:
            server.kill()
    report(results, loads)


if __name__ == "__main__":
    main()
