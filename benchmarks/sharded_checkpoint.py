"""Sharded checkpoints side by side: 2-rank ModelParallelStrategy (FSDP2), the ways to save them.

Run: ``python benchmarks/sharded_checkpoint.py`` (``--sizes 200`` for a quick run; ``--rows`` to pick).

For a model + Adam state of about 200 MB and 4x that, 800 MB, in total (``--sizes``), half on each of
2 gloo ranks on the CPU, each row is one 2-rank Lightning job that trains and saves a sharded
checkpoint at fixed steps:

- ``floor``: each rank copies its local tensors into buffers allocated once (the staging floor), then
  writes those bytes to one file and fsyncs it, both ranks at once (the raw write floor);
- ``lightning``: Lightning's own sharded save, ``trainer.save_checkpoint(<fresh dir>)`` (synchronous
  DCP), plus the fsyncs it leaves out (``meta.pt``, the directories) to make it durable;
- ``dcp thread`` / ``dcp process``: Lightning's checkpoint handed to ``dcp.async_save`` (thread or
  process executor, DCP's default stager, a dedicated gloo group), ``meta.pt`` written by rank 0;
  durable when DCP's upload future resolves (no manifest, no directory fsync, no commit);
- ``ours``: ``RequeueCheckpoint`` with ``DurableCheckpointIO(asynchronous=True)``: reused staging
  buffers, ``dcp.save`` in a writer thread, per-rank hashing, manifest, directory commit; durable when
  ``last.ckpt`` names the new directory (retention runs after). The same job also measures the floor
  (as in the ``floor`` row) ``FLOOR_BEFORE`` steps before each save, with no write in flight: the
  target ratios are taken against it, medians over the saves after the first, side by side under the
  same load. ``--breakdown`` prints where the stall and the time to durable go, phase by phase.

Columns: the training-loop stall per save (mean over the saves after the first, slowest rank; the
median for ``ours``); the
time from the save until it is durable; the median step time while a write is in flight against
steps with none; the extra peak RSS of rank 0's process tree (rank 1 and checkpoint processes are its
children) over its RSS before the first save. The first save is reported apart (the process executor
starts its process then). Numbers are noisy on a shared machine: the script prints the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROWS = ["floor", "lightning", "dcp thread", "dcp process", "ours"]
SAVE_STEPS = (4, 10, 16, 22, 28)
STEPS = 30
#: In the ``ours`` row the floor is measured this many steps before each save, in the same job.
FLOOR_BEFORE = 3
WIDTH = 2048
TARGETS = (
    "ours: stall <= 1.5x the staging floor; durable <= 2x the raw write + fsync floor; "
    "step slowdown while writing no worse than dcp process"
)


def depth_for(total_mb: int) -> int:
    """Layers of WIDTH x WIDTH whose weights and Adam moments (3 copies, float32) are ``total_mb``."""
    return max(1, round(total_mb * 2**20 / (3 * 4 * WIDTH * WIDTH)))


# -- where the time of a save goes (``ours``, --breakdown) ---------------------------------------------

#: (label, where it runs, what is wrapped): the phases of a save of ours, in the order they happen.
PHASES = (
    ("wait for the save before", "stall", "lightning_resume.io.sharded.saver:DirectorySaver._finish_pending"),
    ("agree: outcome + new directory", "stall", "lightning_resume.io.sharded.saver:DirectorySaver._agree"),
    ("Lightning state + barrier", "stall", "lightning_resume.io.sharded.saver:capture_checkpoint"),
    ("staging copy", "stall", "lightning_resume.io.sharded.stager:ReusedBufferStager.stage"),
    ("pickle meta.pt (rank 0)", "stall", "lightning_resume.io.sharded.saver:_serialised"),
    ("hand-off to the writer", "stall", "concurrent.futures:ThreadPoolExecutor.submit"),
    ("dcp.save", "durable", "torch.distributed.checkpoint:save"),
    ("  plan (+ collective)", "durable", "torch.distributed.checkpoint.utils:_DistWrapper.reduce_scatter"),
    ("  write..metadata (+ coll.)", "durable", "torch.distributed.checkpoint.utils:_DistWrapper.all_reduce"),
    (
        "    of which shards + fsync",
        "durable",
        "torch.distributed.checkpoint.filesystem:_FileSystemWriter.write_data",
    ),
    ("meta.pt write + fsync", "durable", "lightning_resume.io.sharded.saver:write_bytes_durably"),
    ("hash own shards + part", "durable", "lightning_resume.io.sharded.saver:DirectorySaver._record_part"),
    ("rank 0: wait parts..commit", "durable", "lightning_resume.io.sharded.saver:DirectorySaver._commit"),
    ("  of which manifest", "durable", "lightning_resume.io.sharded.parts:build_manifest"),
    ("  of which commit + prune", "durable", "lightning_resume.io.sharded.parts:commit_directory"),
)


def instrument(events: list[tuple[str, float, float]]) -> None:
    """Wrap each phase's function so that every call appends ``(label, start, end)`` to ``events``."""
    import functools
    import importlib

    for label, _, target in PHASES:
        module_name, _, attr = target.partition(":")
        owner: Any = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)

        def timed(*args: Any, _original: Any = original, _label: str = label, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                events.append((_label, start, time.perf_counter()))

        setattr(owner, name, functools.wraps(original)(timed))


# -- the measured job (every rank) -------------------------------------------------------------------


def job(row: str, total_mb: int, out: Path) -> None:
    import lightning.pytorch as pl
    import psutil
    import torch
    import torch.distributed.checkpoint as dcp
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch import nn
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_resume import DurableCheckpointIO, RequeueCheckpoint, RunDir
    from lightning_resume._collectives import cpu_group
    from lightning_resume._compat.lightning import capture_checkpoint
    from lightning_resume._storage.atomic import fsync_file
    from lightning_resume.io.sharded import parts
    from lightning_resume.io.sharded.dcp import dcp_state

    torch.set_num_threads(1)
    me = psutil.Process()
    commits: list[float] = []
    events: list[tuple[str, float, float]] = []
    commit = parts.commit_directory

    def timed_commit(*args: Any, on_step: Any = None, **kwargs: Any) -> Path:
        # Ours is durable when rank 0's commit has swapped the pointer (retention runs after).
        def observe(step: str) -> None:
            if step == "after_swap":
                commits.append(time.perf_counter())
            if on_step is not None:
                on_step(step)

        return commit(*args, on_step=observe, **kwargs)

    parts.commit_directory = timed_commit  # type: ignore[assignment]
    if row == "ours":
        instrument(events)

    def rss() -> int:
        total = me.memory_info().rss
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(depth_for(total_mb))])

        def configure_model(self) -> None:
            from torch.distributed.fsdp import fully_shard

            for layer in self.layers:
                fully_shard(layer, mesh=self.device_mesh["data_parallel"])
            fully_shard(self.layers, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layers(batch[0]).square().mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-5)

    class Bench(pl.Callback):
        def __init__(self) -> None:
            self.saves: list[dict[str, Any]] = []
            self.floors: list[dict[str, Any]] = []
            self.steps: list[tuple[float, float]] = []
            self.pending: Any = None
            self.group: Any = None
            self.buffers: list[torch.Tensor] | None = None
            self.busy: tuple[threading.Thread, Path] | None = None
            self.rss0 = 0
            self.rss_max = 0
            self.requeue: RequeueCheckpoint | None = None
            self.started = 0.0

        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            if row.startswith("dcp"):
                self.group = cpu_group(trainer.strategy)
            found = [cb for cb in trainer.callbacks if isinstance(cb, RequeueCheckpoint)]  # type: ignore[attr-defined]
            self.requeue = found[0] if found else None

        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            self.steps.append((self.started, time.perf_counter()))
            self.rss_max = max(self.rss_max, rss())
            if trainer.global_step == SAVE_STEPS[0] - 1:
                self.rss0 = rss()
            if row == "ours" and trainer.global_step + FLOOR_BEFORE in SAVE_STEPS:
                self.paired_floor(trainer)
            if trainer.global_step in SAVE_STEPS:
                self.end_busy_floor()
                self.save(trainer)
                self.rss_max = max(self.rss_max, rss())

        def local_tensors(self, trainer: pl.Trainer) -> list[torch.Tensor]:
            found: list[torch.Tensor] = []

            def walk(value: Any) -> None:
                if isinstance(value, torch.Tensor):
                    found.append(value.to_local() if hasattr(value, "to_local") else value)
                elif isinstance(value, dict):
                    for v in value.values():
                        walk(v)
                elif isinstance(value, (list, tuple)):
                    for v in value:
                        walk(v)

            walk(trainer.strategy.lightning_module_state_dict())
            for optimizer in trainer.optimizers:
                walk(trainer.strategy.optimizer_state(optimizer))
            return found

        def paired_floor(self, trainer: pl.Trainer) -> None:
            """The floor measured in the same job a few steps before each save of ours (none in flight)."""
            assert self.requeue is not None
            if (saver := self.requeue._writes.writer(trainer)) is not None:
                saver.wait(trainer)
            self.floors.append(self.floor(trainer, out / f"floor-{trainer.global_step}"))
            shutil.rmtree(out / f"floor-{trainer.global_step}", ignore_errors=True)
            self.busy_floor(trainer, out / f"busy-floor-{trainer.global_step}", self.floors[-1])

        def busy_floor(self, trainer: pl.Trainer, target: Path, record: dict[str, Any]) -> None:
            """The same raw write + fsync in a thread while training goes on: the write floor under the
            load of training, which ours's background write shares the cores with (done before the save)."""
            assert self.buffers is not None
            buffers, rank = self.buffers, trainer.global_rank
            target.mkdir(parents=True, exist_ok=True)

            def write() -> None:
                t0 = time.perf_counter()
                with open(target / f"raw_{rank}.bin", "wb", buffering=0) as f:
                    for buffer in buffers:
                        f.write(memoryview(buffer.reshape(-1).view(torch.uint8).numpy()))
                    os.fsync(f.fileno())
                t1 = time.perf_counter()
                # The same tensors in DCP's file format: one torch.save per tensor (what its
                # FileSystemWriter writes), fsynced.
                with open(target / f"torch_save_{rank}.bin", "wb") as f:
                    for buffer in buffers:
                        torch.save(buffer, f)
                    f.flush()
                    os.fsync(f.fileno())
                record.update(busy_write=t1 - t0, busy_torch_save=time.perf_counter() - t1)

            self.busy = (threading.Thread(target=write, daemon=True), target)
            self.busy[0].start()

        def end_busy_floor(self) -> None:
            if self.busy is not None:
                self.busy[0].join()
                shutil.rmtree(self.busy[1], ignore_errors=True)
                self.busy = None

        def floor(self, trainer: pl.Trainer, target: Path) -> dict[str, Any]:
            """Copy the local tensors into buffers allocated once; write them to one file and fsync it."""
            rank, strategy = trainer.global_rank, trainer.strategy
            tensors = self.local_tensors(trainer)
            if self.buffers is None:
                self.buffers = [torch.empty_like(t) for t in tensors]
            strategy.barrier()
            t0 = time.perf_counter()
            for buffer, tensor in zip(self.buffers, tensors, strict=True):
                buffer.copy_(tensor)
            t1 = time.perf_counter()
            target.mkdir(parents=True, exist_ok=True)
            strategy.barrier()
            t2 = time.perf_counter()
            with open(target / f"raw_{rank}.bin", "wb", buffering=0) as f:
                for buffer in self.buffers:
                    f.write(memoryview(buffer.reshape(-1).view(torch.uint8).numpy()))
                os.fsync(f.fileno())
            strategy.barrier()
            t3 = time.perf_counter()
            size = sum(b.numel() * b.element_size() for b in self.buffers)
            return {"stall": t1 - t0, "durable": t3 - t2, "stage": t1 - t0, "write": t3 - t2, "bytes": size}

        def save(self, trainer: pl.Trainer) -> None:
            strategy = trainer.strategy
            target = out / f"save-{trainer.global_step}"
            record: dict[str, Any] = {"step": trainer.global_step}
            strategy.barrier()
            t0 = time.perf_counter()
            if row == "floor":
                record.update(self.floor(trainer, target))
            elif row == "lightning":
                trainer.save_checkpoint(target)
                if trainer.is_global_zero:
                    fsync_file(target / "meta.pt")
                    for folder in (target, out):
                        fd = os.open(folder, os.O_RDONLY)
                        os.fsync(fd)
                        os.close(fd)
                strategy.barrier()
                record.update(stall=time.perf_counter() - t0, durable=time.perf_counter() - t0)
            elif row.startswith("dcp"):
                if self.pending is not None:
                    self.pending.result()
                    t0 = time.perf_counter()
                if trainer.is_global_zero:
                    target.mkdir(parents=True)
                checkpoint = capture_checkpoint(trainer, target)
                state = dcp_state(strategy, checkpoint)
                kind = AsyncCheckpointerType.PROCESS if row == "dcp process" else AsyncCheckpointerType.THREAD
                response = dcp.async_save(
                    state, checkpoint_id=target, process_group=self.group, async_checkpointer_type=kind
                )
                future = response.upload_completion if isinstance(response, AsyncSaveResponse) else response
                if trainer.is_global_zero:
                    with open(target / "meta.pt", "wb") as f:
                        torch.save(checkpoint, f)
                        f.flush()
                        os.fsync(f.fileno())
                record["stall"] = time.perf_counter() - t0
                future.add_done_callback(lambda _, r=record, s=t0: r.update(durable=time.perf_counter() - s))
                self.pending = future
            else:
                assert self.requeue is not None
                before = len(commits)
                self.requeue.save(trainer)
                record.update(stall=time.perf_counter() - t0, commit_index=before, start=t0)
            record.setdefault("start", t0)
            self.saves.append(record)

        def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if self.pending is not None:
                self.pending.result()
            if self.requeue is not None and (saver := self.requeue._writes.writer(trainer)) is not None:
                saver.wait(trainer)
            result = {
                "saves": self.saves,
                "steps": self.steps,
                "commits": commits,
                "floors": self.floors,
                "events": events,
                "rss0": self.rss0,
                "rss_max": self.rss_max,
            }
            (out / f"result_{trainer.global_rank}.json").write_text(json.dumps(result, default=str))

    bench = Bench()
    callbacks: list[pl.Callback] = [bench]
    plugins = None
    if row == "ours":
        callbacks += [
            RunDir(root=out / "runs", key="bench"),
            RequeueCheckpoint(every_n_train_steps=None, save_on_train_epoch_end=False),
        ]
        plugins = [DurableCheckpointIO(asynchronous=True)]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(
            data_parallel_size=2, tensor_parallel_size=1, timeout=timedelta(minutes=5)
        ),
        plugins=plugins,
        max_steps=STEPS,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=row == "ours",
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    data = TensorDataset(torch.randn(4 * STEPS * 2, WIDTH))
    trainer.fit(Model(), DataLoader(data, batch_size=4))


# -- the driver --------------------------------------------------------------------------------------


def summarize(out: Path) -> dict[str, Any]:
    ranks = [json.loads((out / f"result_{r}.json").read_text()) for r in (0, 1)]
    r0 = ranks[0]
    spans = []  # (start, durable end) of each save, rank 0's clock
    for index, save in enumerate(r0["saves"]):
        start = float(save["start"])
        if "commit_index" in save:  # ours: durable when committed
            end = r0["commits"][int(save["commit_index"])]
            save["durable"] = end - start
        spans.append((start, start + float(save.get("durable", save["stall"]))))
        r0["saves"][index] = save

    def mean_later(key: str) -> float:
        values = [
            max(float(a.get(key, 0.0)), float(b.get(key, 0.0)))
            for a, b in zip(*(r["saves"] for r in ranks), strict=True)
        ]
        later = values[1:]
        return statistics.mean(later) if later else float("nan")

    def first(key: str) -> float:
        return max(float(r["saves"][0].get(key, 0.0)) for r in ranks)

    for save in ranks[1]["saves"]:
        save.pop("durable", None)  # rank 0 commits (ours) and writes DCP's .metadata last: its clock
    idle, busy = [], []
    for start, end in r0["steps"][3:]:
        # Steps are timed without the save calls: a step is busy when a write is in flight as it starts.
        (busy if any(s <= start < e for s, e in spans) else idle).append(end - start)
    row = {
        "stall": mean_later("stall"),
        "durable": mean_later("durable"),
        "first_stall": first("stall"),
        "first_durable": first("durable"),
        "step_idle": statistics.median(idle) if idle else float("nan"),
        "step_busy": statistics.median(busy) if busy else float("nan"),
        "busy_steps": len(busy),
        "extra_rss_mb": (r0["rss_max"] - r0["rss0"]) / 2**20 if r0["rss0"] else float("nan"),
    }
    if r0.get("floors"):
        # The floor measured in this job before each save (saves after the first): medians.
        floors = [{k: max(a[k], b[k]) for k in a} for a, b in zip(*(r["floors"] for r in ranks), strict=True)]
        later = floors[1:] or floors
        row.update(
            stage=statistics.median(f["stage"] for f in later),
            write=statistics.median(f["write"] for f in later),
            busy_write=statistics.median(f.get("busy_write", float("nan")) for f in later),
            busy_torch_save=statistics.median(f.get("busy_torch_save", float("nan")) for f in later),
            bytes_per_rank=floors[-1]["bytes"],
            stall=statistics.median(
                max(a["stall"], b["stall"])
                for a, b in list(zip(*(r["saves"] for r in ranks), strict=True))[1:]
            ),
            durable=statistics.median(float(v["durable"]) for v in r0["saves"][1:]),
            paired=True,
        )
    if r0.get("events"):
        row["breakdown"] = breakdown(ranks, r0)
    elif "bytes" in r0["saves"][-1]:
        row.update(
            stage=mean_later("stage"), write=mean_later("write"), bytes_per_rank=r0["saves"][-1]["bytes"]
        )
    return row


def breakdown(ranks: list[dict[str, Any]], r0: dict[str, Any]) -> dict[str, float]:
    """Per phase: the median over the saves after the first of its seconds in that save (slowest rank)."""
    ends = [float(s["start"]) + float(s["durable"]) for s in r0["saves"]]
    per_save: list[dict[str, float]] = []
    for index in range(1, len(ends)):
        totals: dict[str, float] = {}
        for rank in ranks:
            start = float(rank["saves"][index]["start"])
            mine: dict[str, float] = {}
            for label, t0, t1 in rank["events"]:
                if start <= t0 <= ends[index]:
                    mine[label] = mine.get(label, 0.0) + t1 - t0
            for label, seconds in mine.items():
                totals[label] = max(totals.get(label, 0.0), seconds)
        per_save.append(totals)
    return {label: statistics.median(s.get(label, 0.0) for s in per_save) for label, _, _ in PHASES}


def run_job(row: str, size: int, out: Path, tree: str | None = None) -> dict[str, Any]:
    """One 2-rank job of ``row`` (importing ``lightning_resume`` from ``tree``), summarised."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([tree, *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, __file__, "--job", row, "--size", str(size), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env, start_new_session=True)
    (out / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"error": proc.returncode}
    result = summarize(out)
    for folder in (p for p in out.iterdir() if p.is_dir()):
        shutil.rmtree(folder, ignore_errors=True)
    return result


def compare_trees(args: argparse.Namespace, work: Path) -> None:
    """The ours row of each checkout, taking turns: stall against its staging floor and time to durable
    against its raw write + fsync floor (both measured in the same job), medians over the repeats."""
    trees = [(n, str(Path(p).resolve())) for n, p in (t.split("=", 1) for t in args.trees.split(","))]
    runs: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for size in map(int, args.sizes.split(",")):
        for load in [0] + ([args.load] if args.load > 0 else []):
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
            try:
                for repeat in range(args.repeats):
                    for name, tree in trees[repeat % len(trees) :] + trees[: repeat % len(trees)]:
                        out = work / f"{size}-{load}-{name}-{repeat}"
                        result = run_job("ours", size, out, tree)
                        print(f"{size} MB, load {load}, {name} run {repeat + 1}: {result}", flush=True)
                        if "error" not in result:
                            runs.setdefault((size, load, name), []).append(result)
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
    print(f"\nload average after: {os.getloadavg()}")
    for size, load in sorted({(s, lo) for s, lo, _ in runs}):
        where = "quiet" if load == 0 else f"{load} busy processes"
        print(f"\n### {size} MB in total, 2 ranks, {where}\n")
        print("| checkout | stall s | x staging floor | durable s | x write floor | runs |")
        print("|---|---|---|---|---|---|")
        for name, _ in trees:
            results = runs.get((size, load, name), [])
            if not results:
                print(f"| {name} | failed | | | | 0 |")
                continue
            med = {
                k: statistics.median(r[k] for r in results) for k in ("stall", "stage", "durable", "write")
            }
            stall_x = statistics.median(r["stall"] / r["stage"] for r in results)
            durable_x = statistics.median(r["durable"] / r["write"] for r in results)
            print(
                f"| {name} | {med['stall']:.3f} | {stall_x:.2f}x | {med['durable']:.3f} | {durable_x:.2f}x | "
                f"{len(results)} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="200,800", help="total state sizes in MB (default: 200,800)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"rows to run (default: {','.join(ROWS)})")
    parser.add_argument(
        "--out",
        default=None,
        help="keep the checkpoints and results here (default: a temporary folder, "
        "where only the results and logs are kept)",
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="print where the time of a save of ours goes"
    )
    parser.add_argument(
        "--trees",
        default=None,
        help="name=path,...: the ours row (and its paired floors) of each checkout side by side, taking "
        "turns, --repeats times, quiet and with --load busy processes",
    )
    parser.add_argument("--repeats", type=int, default=3, help="with --trees: runs per checkout")
    parser.add_argument("--load", type=int, default=2, help="with --trees: busy processes (0: quiet only)")
    parser.add_argument("--job", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=200, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(args.job, args.size, Path(args.out))
        return
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="sharded-bench-"))
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} CPUs")
    if args.trees:
        compare_trees(args, work)
        return
    results: dict[str, dict[str, Any]] = {}
    for size in map(int, args.sizes.split(",")):
        for row in args.rows.split(","):
            out = work / f"{size}" / row.replace(" ", "_")
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            cmd = [sys.executable, __file__, "--job", row, "--size", str(size), "--out", str(out)]
            started = time.time()
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=3600,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
                start_new_session=True,
            )
            (out / "log.txt").write_text(proc.stdout + proc.stderr)
            key = f"{size} MB {row}"
            if proc.returncode != 0:
                results[key] = {"error": proc.returncode}
                print(f"{key}: failed ({proc.returncode}), see {out / 'log.txt'}", flush=True)
                continue
            results[key] = summarize(out)
            if not args.out:  # the checkpoints are up to 20 GB a row: keep only the results and the log
                for folder in (p for p in out.iterdir() if p.is_dir()):
                    shutil.rmtree(folder, ignore_errors=True)
            print(f"{key}: {time.time() - started:.0f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    (work / "summary.json").write_text(json.dumps(results, indent=1))
    print()
    print(f"load average after: {os.getloadavg()}")
    header = f"{'row':22s} {'stall s':>8s} {'durable s':>9s} {'1st stall':>9s} {'1st dur.':>9s} "
    header += f"{'step idle':>9s} {'step busy':>9s} {'+RSS MB':>8s}"
    for size in map(int, args.sizes.split(",")):
        floor = results.get(f"{size} MB floor", {})
        print()
        if "stage" in floor:
            print(
                f"{size} MB total ({floor['bytes_per_rank'] / 2**20:.0f} MB per rank): staging floor "
                f"{floor['stage']:.3f} s, raw write + fsync floor {floor['write']:.3f} s"
            )
        print(header)
        for row in args.rows.split(","):
            r = results.get(f"{size} MB {row}", {})
            if not r or "error" in r:
                print(f"{row:22s} failed")
                continue
            print(
                f"{row:22s} {r['stall']:8.3f} {r['durable']:9.3f} {r['first_stall']:9.3f} "
                f"{r['first_durable']:9.3f} {r['step_idle']:9.3f} {r['step_busy']:9.3f} "
                f"{r['extra_rss_mb']:8.0f}"
            )
        ours, process = results.get(f"{size} MB ours", {}), results.get(f"{size} MB dcp process", {})
        if ours.get("paired"):
            floor = ours  # measured in the same job, a few steps before each save: side by side
            print(
                f"floor in the ours job (medians): staging {ours['stage']:.3f} s, raw write + fsync "
                f"{ours['write']:.3f} s (while training: {ours['busy_write']:.3f} s; as one torch.save per "
                f"tensor, DCP's file format: {ours['busy_torch_save']:.3f} s); ours (medians): "
                f"stall {ours['stall']:.3f} s, durable {ours['durable']:.3f} s"
            )
        if args.breakdown and "breakdown" in ours:
            print("where a save of ours goes (median s over the saves after the first, slowest rank):")
            parts_of_stall = 0.0
            for label, where, _ in PHASES:
                print(f"  {where:8s} {label:30s} {ours['breakdown'][label]:8.3f}")
                parts_of_stall += ours["breakdown"][label] if where == "stall" else 0.0
            rest = ours["stall"] - parts_of_stall
            print(f"  {'stall':8s} {'rest (outside the above)':30s} {rest:8.3f}")
            copy = ours["breakdown"]["staging copy"]
            print(
                f"our staging copy alone: {copy / ours['stage']:.2f}x the staging floor; the rest of the "
                f"stall ({ours['stall'] - copy:.3f} s) is Lightning's state capture, the agreement and the "
                f"barriers, which the floor leaves out"
            )
        if "stage" in floor and "stall" in ours:
            print(
                f"targets ({TARGETS}): stall {ours['stall'] / floor['stage']:.1f}x floor, durable "
                f"{ours['durable'] / floor['write']:.1f}x floor "
                f"({ours['durable'] / ours.get('busy_write', float('nan')):.1f}x the same write while "
                f"training, {ours['durable'] / ours.get('busy_torch_save', float('nan')):.1f}x it in DCP's "
                f"format), step while writing "
                f"{ours['step_busy'] / ours['step_idle']:.2f}x idle (dcp process "
                f"{process.get('step_busy', float('nan')) / process.get('step_idle', float('nan')):.2f}x)"
            )
    print(f"\nresults in {work}")


if __name__ == "__main__":
    main()
