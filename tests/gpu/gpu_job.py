"""The GPU tests' job: one process, one device, the package's callbacks on a real process group.

Run as ``python tests/gpu/gpu_job.py --root DIR --out FILE --device cuda --strategy ddp``. The
strategy is Lightning's ``DDPStrategy`` (NCCL on CUDA, gloo on the CPU) or ``ModelParallelStrategy``
(FSDP2), with ``devices=1``: a process group of world size 1. It writes the final weights (on the CPU)
to ``FILE`` and ``{"run_dir", "resumed", "backend", "cuda_rng"}`` to ``FILE.json``. Test-only
scaffolding, not shipped:

- ``--collectives``: run the package's collectives although the world has one rank. The package skips
  them there (nothing to agree on), so nothing would reach the backend; this job replaces that one
  test (``_collectives._distributed``) with "a process group is initialised", and at every save runs
  the gather ``RequeueCheckpoint`` runs on several ranks, on the same payload (the random states,
  CUDA's included, and the loader states), checking that it comes back equal;
- ``--kill-after-step N``: SIGKILL after step N (a preemption with no warning);
- ``--signal-at N``: a real SIGTERM to this process after step N; ``PreemptionHandler`` stops the job.

Deterministic throughout: ``torch.use_deterministic_algorithms(True)`` and, on CUDA,
``CUBLAS_WORKSPACE_CONFIG=:4096:8``; the model's dropout draws from the device's generator, so an
exact resume needs the CUDA random states back.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, ParallelStrategy, Strategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_resume import DurableCheckpointIO, PreemptionHandler, RequeueCheckpoint, RunDir, _collectives
from lightning_resume.exact_resume import rng


class Net(pl.LightningModule):
    """An MLP with dropout (the device's random generator matters); FSDP2-sharded under ModelParallel."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.2), nn.Linear(width, 1))

    def configure_model(self) -> None:
        if isinstance(self.trainer.strategy, ModelParallelStrategy):
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in self.layers:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self.layers, mesh=mesh)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layers(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def same(a: Any, b: Any) -> bool:
    """Equal nested values, tensors compared exactly."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


class Counted:
    """``_collectives._distributed`` for ``--collectives``, counting the collectives it lets through."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, strategy: Strategy) -> bool:
        ran = isinstance(strategy, ParallelStrategy) and torch.distributed.is_initialized()
        self.calls += ran
        return ran


class Harness(pl.Callback):
    """Kills, signals, and the collectives of ``--collectives``, at step boundaries; prints what ran."""

    def __init__(self, args: argparse.Namespace, collectives: Counted) -> None:
        self.args = args
        self.collectives = collectives
        self.gathered = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
        print(f"BACKEND {backend} DEVICE {trainer.strategy.root_device}", flush=True)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        print(f"COLLECTIVES {self.collectives.calls} GATHERED {self.gathered}", flush=True)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        print(f"COLLECTIVES {self.collectives.calls} GATHERED {self.gathered}", flush=True)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if step == self.args.kill_after_step:
            print(f"SIGKILL after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if step == self.args.signal_at:
            print(f"SIGTERM after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)

    def on_save_checkpoint(self, trainer: pl.Trainer, *args: Any) -> None:
        if not self.args.collectives:
            return
        # What RequeueCheckpoint gathers from every rank: the random states and the loader states.
        mine = {"rng": rng.capture(), "loaders": [{"batches": trainer.global_step}]}
        gathered = _collectives.gather_objects(trainer.strategy, mine)
        assert len(gathered) == 1 and same(gathered[0], mine), "the gather changed what it carried"
        assert _collectives.broadcast(trainer.strategy, trainer.global_step) == trainer.global_step
        _collectives.barrier(trainer.strategy, "gpu_job")
        self.gathered += 1


def final_weights(module: pl.LightningModule) -> dict[str, torch.Tensor]:
    """The full weights on the CPU (a collective under ModelParallelStrategy)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {k: v.detach().clone() for k, v in get_model_state_dict(module, options=options).items()}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--strategy", choices=["ddp", "model_parallel"], default="ddp")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--collectives", action="store_true")
    p.add_argument("--kill-after-step", type=int, default=None)
    p.add_argument("--signal-at", type=int, default=None)
    args = p.parse_args(argv)

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[lightning_resume] %(levelname)s %(message)s"))
    logging.getLogger("lightning_resume").addHandler(handler)
    logging.getLogger("lightning_resume").setLevel(logging.INFO)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts: before any step
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    counted = Counted()
    if args.collectives:
        _collectives._distributed = counted  # type: ignore[assignment]
    pl.seed_everything(1234, workers=True)

    accelerator = "gpu" if args.device == "cuda" else "cpu"
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.strategy == "ddp":
        strategy: Strategy = DDPStrategy(process_group_backend=backend, timeout=timedelta(seconds=120))
    else:
        strategy = ModelParallelStrategy(
            data_parallel_size=1, tensor_parallel_size=1, timeout=timedelta(seconds=120)
        )
    run_dir = RunDir(root=args.root)
    harness = Harness(args, counted)
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        strategy=strategy,
        plugins=[DurableCheckpointIO()],
        max_steps=args.steps,
        callbacks=[
            harness,
            RequeueCheckpoint(every_n_train_steps=args.every),
            PreemptionHandler(requeue=False),
            run_dir,
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        deterministic=True,
        default_root_dir=args.root,
    )
    g = torch.Generator().manual_seed(1234)
    data = TensorDataset(torch.randn(64, args.width, generator=g), torch.randn(64, 1, generator=g))
    trainer.fit(Net(args.width), DataLoader(data, batch_size=8, shuffle=True))
    weights = final_weights(trainer.lightning_module)
    torch.save(weights, args.out)
    result = {
        "run_dir": str(run_dir.path),
        "resumed": run_dir.is_resumed,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "gathered": harness.gathered,
        "cuda_rng": torch.cuda.is_initialized(),
    }
    with open(args.out + ".json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1:])
