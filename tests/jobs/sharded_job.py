"""The sharded-checkpoint tests' job: a tiny FSDP2 model under ``ModelParallelStrategy`` on CPU ranks.

Run as ``python -m jobs.sharded_job --root DIR --out FILE [--devices 2]``. It uses the real
``RunDir`` / ``RequeueCheckpoint`` (and ``PreemptionHandler``, ``DurableCheckpointIO`` when asked),
writes the final full weights to ``FILE`` and ``{"run_dir", "resumed", "first_step"}`` to
``FILE.json``. Test-only scaffolding, not shipped:

- ``--refs DIR``: the full weights at every save, as ``DIR/step<N>.pt`` (a reference run);
- ``--loaded PREFIX``: on a resume, the weights just loaded (``PREFIX.pt``, ``PREFIX.json``);
- ``--kill-after-step N``: SIGKILL the whole job after step N (a preemption with no warning);
- ``--kill-point NAME@N``: SIGKILL the whole job at a point inside the save of step N. Points inside
  DCP's write (``after_own_shard`` on rank 1, ``before_metadata``, ``before_meta_pt``) wrap DCP's
  ``FileSystem``; the steps of the commit wrap :func:`lightning_resume.io.sharded.parts.commit_directory`
  from outside with an ``on_step`` observer (the production code passes none);
- ``--preempt-rank R --preempt-step N``: SIGTERM to rank R after step N, with ``PreemptionHandler``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.utils.data import DataLoader, TensorDataset

from lightning_resume import (
    DurableCheckpointIO,
    MemoryTier,
    Mirror,
    PreemptionHandler,
    RequeueCheckpoint,
    RunDir,
)
from lightning_resume.io.sharded import parts

#: The global step of the save being written (one save is in flight at a time).
SAVING = {"step": -1}


class Sharded(pl.LightningModule):
    """A stack of linear layers sharded with ``fully_shard``; its noise draws from the global RNG."""

    def __init__(self, width: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)], nn.Linear(width, 1))

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in self.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.layers, mesh=mesh)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch[0], batch[1]  # a third tensor: the sample indices (--epoch-log)
        x = x + 0.01 * torch.randn_like(x)  # exact resume needs the random state back
        return nn.functional.mse_loss(self.layers(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def full_weights(module: pl.LightningModule) -> dict[str, torch.Tensor]:
    """The unsharded weights, on every rank (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {k: v.detach().clone() for k, v in get_model_state_dict(module, options=options).items()}


def dump(module: pl.LightningModule, path: str | Path) -> None:
    weights = full_weights(module)
    if module.global_rank == 0:
        torch.save(weights, path)


def kill(where: str) -> None:
    print(f"KILL at {where} (step {SAVING['step']}, pid {os.getpid()})", flush=True)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def install_kill_point(name: str, step: int) -> None:
    """Make the save of ``step`` die at ``name``: wraps DCP's filesystem and the commit from outside."""
    create_stream, rename, commit = FileSystem.create_stream, FileSystem.rename, parts.commit_directory

    def here() -> bool:
        return SAVING["step"] == step

    @contextlib.contextmanager
    def stream(self: FileSystem, path: Any, mode: str) -> Iterator[Any]:
        if here() and name == "before_metadata" and Path(path).name == ".metadata.tmp":
            kill(name)  # every shard is written, .metadata not yet
        with create_stream(self, path, mode) as s:
            yield s
        if here() and name == "after_own_shard" and Path(path).name.startswith("__1_") and "w" in mode:
            kill(name)  # rank 1's shard is written and fsynced, nothing else known
        return None

    def renamed(self: FileSystem, path: Any, new_path: Any) -> None:
        rename(self, path, new_path)
        if here() and name == "before_meta_pt" and Path(new_path).name == ".metadata":
            kill(name)  # .metadata in place, meta.pt not yet written

    def observer(point: str) -> None:
        if point == name:
            kill(name)

    @functools.wraps(commit)
    def committed(save_dir: Path, pointer: Path, manifest: Any, keep: int, on_step: Any = None) -> Path:
        watching = manifest.global_step == step
        return commit(save_dir, pointer, manifest, keep, on_step=observer if watching else lambda _: None)

    FileSystem.create_stream = stream  # type: ignore[method-assign]
    FileSystem.rename = renamed  # type: ignore[method-assign]
    parts.commit_directory = committed  # type: ignore[assignment]


class Harness(pl.Callback):
    """Records the step being saved, dumps references and loaded weights, kills and signals."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.first_step: int | None = None

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Any) -> None:
        SAVING["step"] = trainer.global_step
        if self.args.refs:
            dump(pl_module, Path(self.args.refs) / f"step{trainer.global_step}.pt")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.first_step = trainer.global_step
        if trainer.global_step > 0 and self.args.loaded:
            dump(pl_module, self.args.loaded + ".pt")
            if trainer.is_global_zero:
                Path(self.args.loaded + ".json").write_text(json.dumps({"global_step": trainer.global_step}))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dump(pl_module, self.args.out)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if step == self.args.kill_after_step:
            kill(f"after step {step}")
        if step == self.args.preempt_step and trainer.global_rank == self.args.preempt_rank:
            print(f"SIGTERM to rank {trainer.global_rank} after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)


# -- another number of ranks (tests/exact_resume/test_world_change.py) ----------------------------------


class EpochLog(pl.Callback):
    """Write the epoch, global step, number of ranks and sample indices of every training batch."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        where = f"{trainer.current_epoch} {trainer.global_step} {trainer.world_size}"
        with open(f"{self.path}.rank{trainer.global_rank}", "a") as f:
            f.write(f"{where}: {' '.join(map(str, batch[2].tolist()))}\n")


def indexed(data: TensorDataset, args: argparse.Namespace) -> TensorDataset:
    """The data set, with each sample's index as a third tensor when the batches are logged."""
    if not args.epoch_log:
        return data
    return TensorDataset(*data.tensors, torch.arange(len(data)))


# -- end of another number of ranks ----------------------------------------------------------------


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--key", default=None)
    p.add_argument("--devices", type=int, default=2, help="ranks per node")
    p.add_argument("--nodes", type=int, default=1, help="Lightning's num_nodes (the ranks of every node)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--every", type=lambda v: v if v == "auto" else int(v), default=3, help="N or auto")
    p.add_argument("--refs", default=None)
    p.add_argument("--loaded", default=None)
    p.add_argument("--kill-after-step", type=int, default=None)
    p.add_argument("--kill-point", default=None, help="NAME@STEP")
    p.add_argument("--durable", action="store_true", help="DurableCheckpointIO: asynchronous sharded saves")
    p.add_argument("--sync", action="store_true", help="with --durable: asynchronous=False")
    p.add_argument("--keep", type=int, default=None)
    p.add_argument("--mirror", default=None)
    p.add_argument("--mirror-endpoint", default=None, help="an S3 endpoint URL (moto) for --mirror")
    p.add_argument("--preempt-rank", type=int, default=None)
    p.add_argument("--preempt-step", type=int, default=None)
    p.add_argument("--epoch-log", default=None, help="write 'epoch step ranks: indices' per batch and rank")
    p.add_argument("--memory", default=None, help="DurableCheckpointIO(memory=MemoryTier(path=...))")
    p.add_argument("--durable-every", type=int, default=10)
    p.add_argument("--replicas", type=int, default=1)
    args = p.parse_args(argv)

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[lightning_resume] %(levelname)s %(message)s"))
    logging.getLogger("lightning_resume").addHandler(handler)
    logging.getLogger("lightning_resume").setLevel(logging.INFO)
    torch.set_num_threads(1)
    if args.kill_point:
        name, step = args.kill_point.split("@")
        install_kill_point(name, int(step))
    pl.seed_everything(1234, workers=True)

    run_dir = RunDir(root=args.root, key=args.key)
    harness = Harness(args)
    callbacks: list[pl.Callback] = [harness, RequeueCheckpoint(every_n_train_steps=args.every), run_dir]
    if args.preempt_step is not None:
        callbacks.append(PreemptionHandler(requeue=False))
    if args.epoch_log:
        callbacks.append(EpochLog(args.epoch_log))
    plugins = None
    memory = None
    if args.memory:
        memory = MemoryTier(args.memory, replicas=args.replicas, durable_every=args.durable_every)
    if args.durable or args.mirror or memory:
        options: dict[str, Any] = {}
        if args.mirror_endpoint:
            options = {
                "key": "test",
                "secret": "test",
                "client_kwargs": {"endpoint_url": args.mirror_endpoint, "region_name": "us-east-1"},
            }
        plugins = [
            DurableCheckpointIO(
                asynchronous=not args.sync,
                keep=args.keep,
                mirror=Mirror(args.mirror, options) if args.mirror else None,
                dirpath=run_dir.checkpoint_dir if args.mirror else None,
                memory=memory,
            )
        ]
    strategy = ModelParallelStrategy(
        data_parallel_size=args.devices * args.nodes, tensor_parallel_size=1, timeout=timedelta(seconds=60)
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.nodes,
        strategy=strategy,
        plugins=plugins,
        max_epochs=args.epochs,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        deterministic=True,
        default_root_dir=args.root,
    )
    g = torch.Generator().manual_seed(1234)
    data = TensorDataset(torch.randn(64, 32, generator=g), torch.randn(64, 1, generator=g))
    torch.manual_seed(0)
    trainer.fit(Sharded(), DataLoader(indexed(data, args), batch_size=4, shuffle=True))
    if trainer.is_global_zero:
        result = {
            "run_dir": str(run_dir.path),
            "resumed": run_dir.is_resumed,
            "first_step": harness.first_step,
        }
        Path(args.out + ".json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
