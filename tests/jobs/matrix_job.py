"""The exactness matrix's job: a tiny deterministic CPU run with one Lightning feature combination.

Run as ``python -m jobs.matrix_job --root DIR --out FILE --case NAME [--kill-at N] [--kill-in PLACE]``
(``tests/exact_resume/test_matrix.py`` lists the cases). Every case has ``RunDir(root=DIR)``,
``RequeueCheckpoint(every_n_train_steps=2)`` (unless the case says otherwise), a ``CSVLogger`` in the
run dir with ``LocalLoggerResume``, and the case's features.

``--kill-at N`` SIGKILLs the process group at the first ``PLACE`` at or after global step ``N``:
``step`` (default: ``on_train_batch_end`` at global step ``N``), ``batch`` (``on_train_batch_end`` of the
run's ``N``-th training batch, counted from 0 over all epochs), ``val`` (a validation batch, not the
sanity check): there the killer runs before every checkpoint callback, so a save due at that very hook
is not written. ``epoch_end``: at the end of ``on_train_epoch_end``, after every callback's (the
user's checkpoint saves included), before the epoch-end save ``RequeueCheckpoint`` writes as the next
epoch starts. ``sigterm``: a SIGTERM to the job itself at ``on_train_batch_end`` of step ``N``
(``sigterm_batch``: of the run's ``N``-th batch); the case then has a ``PreemptionHandler(requeue=False)``,
which saves and exits with 143.

``--mutate KIND`` (a relaunch only) corrupts one piece of the restored state on purpose, after
lightning_resume put it back (:class:`Mutate`): the resume's self-check must name it.

``--plain`` runs the case with none of lightning_resume's callbacks (Lightning alone, a ``CSVLogger`` in
``--root``): what a fresh run with them must train exactly.

It writes the final weights to ``FILE``; ``FILE.json`` gets the run dir, whether it resumed, the first
and last global step of this attempt, the rows of ``metrics.csv`` and the results of any ``test``;
every attempt appends one line per training batch to ``FILE.trace`` (epoch, batch, step, digests of the
batch and of the weights, the learning rates, the trainable parameters). Test-only scaffolding.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import os
import random
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import (
    BackboneFinetuning,
    BaseFinetuning,
    BatchSizeFinder,
    Checkpoint,
    EarlyStopping,
    LearningRateFinder,
    LearningRateMonitor,
    ModelCheckpoint,
    StochasticWeightAveraging,
)
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from lightning_resume import LocalLoggerResume, PreemptionHandler, RequeueCheckpoint, RunDir
from lightning_resume.exact_resume import held_grads, rng

Batch = Any


def _points(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points of one linear target (the same for every ``seed``), with noise."""
    target = torch.randn(8, 1, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, x @ target + 0.1 * torch.randn(n, 1, generator=g)


class Points(Dataset):
    """``(x, y, index)``; ``augment``: ``x`` jittered with ``torch.rand`` (the global or a worker's RNG)."""

    def __init__(self, n: int, seed: int = 0, augment: bool = False) -> None:
        self.x, self.y = _points(n, seed)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.x[i] + 0.1 * torch.rand(8) if self.augment else self.x[i]
        return x, self.y[i], torch.tensor(i)


class Stream(IterableDataset):
    """An ``IterableDataset`` without ``state_dict``: jitter from torch's global RNG, or from a generator
    of its own (seeded once, advanced over the epochs)."""

    def __init__(self, n: int, own_generator: bool) -> None:
        self.x, self.y = _points(n, 0)
        self.generator = torch.Generator().manual_seed(7) if own_generator else None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        for i in range(len(self.x)):
            yield self.x[i] + 0.1 * torch.rand(8, generator=self.generator), self.y[i], torch.tensor(i)


class Net(pl.LightningModule):
    """``backbone`` (Linear, optional BatchNorm1d, ReLU, Dropout) and ``head``; Adam with StepLR."""

    def __init__(
        self,
        batch_norm: bool = False,
        val_on_step: bool = False,
        manual: bool = False,
        schedule: str = "step",
        trainable_only: bool = False,
        deep: bool = False,
        lr: float = 1e-2,
    ) -> None:
        super().__init__()
        norm: nn.Module = nn.BatchNorm1d(16) if batch_norm else nn.Identity()
        layers = [nn.Linear(8, 16), norm, nn.ReLU(), nn.Dropout(0.2)]
        if deep:  # two stages a fine-tuning unfreezes one after the other
            layers[3:3] = [nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU()]
        self.backbone = nn.Sequential(*layers)
        self.head = nn.Linear(16, 1)
        self.val_on_step, self.schedule, self.trainable_only = val_on_step, schedule, trainable_only
        self.lr = lr  # what LearningRateFinder sets
        self.automatic_optimization = not manual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def _loss(self, batch: Batch) -> torch.Tensor:
        if isinstance(batch, dict):  # several training loaders
            return sum((self._loss(part) for _, part in sorted(batch.items())), torch.zeros(()))
        x, y, _ = batch
        return nn.functional.mse_loss(self(x), y)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor | None:
        if self.automatic_optimization:
            loss = self._loss(batch)
            self.log("loss", loss)
            return loss
        optimizers = self.optimizers()
        assert isinstance(optimizers, list)
        for opt in optimizers:
            opt.zero_grad()
            loss = self._loss(batch)
            self.manual_backward(loss)
            opt.step()
        self.log("loss", loss)
        return None

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), on_step=self.val_on_step, on_epoch=True)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch))

    def configure_optimizers(self) -> Any:
        if not self.automatic_optimization:
            return [
                torch.optim.Adam(self.backbone.parameters(), lr=1e-2),
                torch.optim.SGD(self.head.parameters(), lr=1e-2, momentum=0.9),
            ]
        params = [p for p in self.parameters() if p.requires_grad or not self.trainable_only]
        opt = torch.optim.Adam(params, lr=self.lr)
        if self.schedule == "onecycle":
            total = int(self.trainer.estimated_stepping_batches)
            one_cycle = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-2, total_steps=total)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": one_cycle, "interval": "step"}}
        if self.schedule == "none":
            return opt
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)]


@dataclass
class Setup:
    """What a case changes: sizes, the model, the loaders, the callbacks and the Trainer's arguments."""

    epochs: int = 3
    samples: int = 48
    batch_size: int = 8
    every: int | None = 2
    every_minutes: float | None = None
    model: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)
    before: list[pl.Callback] = field(default_factory=list)  # listed before RequeueCheckpoint
    after: list[pl.Callback] = field(default_factory=list)  # listed after it
    train: Callable[[Setup], Any] | None = None  # the train loader(s); default: shuffled Points
    test: bool = False  # after fit: test(ckpt_path="best") and test(ckpt_path="last")
    datamodule: bool = False  # the loaders come from a LightningDataModule (its batch_size tunable)


class EpochSampler(DistributedSampler):
    """A ``DistributedSampler``; ``OFF`` epochs off (``--mutate sampler_epoch``: one)."""

    OFF = 0

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch + self.OFF)


class Data(pl.LightningDataModule):
    """The case's loaders from a datamodule whose ``batch_size`` a ``BatchSizeFinder`` may set."""

    def __init__(self, setup: Setup) -> None:
        super().__init__()
        self.setup_, self.batch_size = setup, setup.batch_size

    def train_dataloader(self) -> Any:
        self.setup_.batch_size = self.batch_size
        return (self.setup_.train or _shuffled)(self.setup_)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Points(16, seed=3), batch_size=8)


class Milestones(BaseFinetuning):
    """Lightning's ``computer_vision_fine_tuning.py`` fine-tuning: the backbone frozen with its BatchNorm
    layers (``train_bn=False``), its last stage unfrozen at the first milestone, the rest at the second."""

    def __init__(self, milestones: tuple[int, int] = (1, 2)) -> None:
        super().__init__()
        self.milestones = milestones

    def freeze_before_training(self, pl_module: pl.LightningModule) -> None:
        self.freeze(pl_module.backbone, train_bn=False)

    def finetune_function(self, pl_module: pl.LightningModule, epoch: int, optimizer: Any) -> None:
        backbone = pl_module.backbone
        if epoch == self.milestones[0]:
            self.unfreeze_and_add_param_group(backbone[3:], optimizer, train_bn=False)
        elif epoch == self.milestones[1]:
            self.unfreeze_and_add_param_group(backbone[:3], optimizer, train_bn=False)


def _shuffled(setup: Setup) -> DataLoader:
    return DataLoader(Points(setup.samples), batch_size=setup.batch_size, shuffle=True)


def _case(name: str) -> Setup:
    """The setup of case ``name`` (the test's table says what each one is for)."""
    s = Setup()
    if name.startswith("user_save_last_"):
        # Ours saves every 10 steps: the user's save at epoch 0's end (step 6) is the first last.ckpt
        # ("_ours_first": every 2 steps, ours is, and the user's goes to last-v1.ckpt).
        s.every = 2 if name.endswith("ours_first") else 10
        user = ModelCheckpoint(save_last=True)
        (s.after if name.endswith("after") else s.before).append(user)
    elif name == "ckpt_best_default":
        s.test = True
    elif name == "ckpt_best_user":
        s.test = True
        s.after.append(ModelCheckpoint(monitor="val_loss", save_last=True))
    elif name == "finetuning":
        s.model["trainable_only"] = True
        s.after.append(BackboneFinetuning(unfreeze_backbone_at_epoch=1))
    elif name == "dist_sampler":  # a sampler with set_epoch (single process: Lightning keeps it)
        s.train = lambda setup: DataLoader(
            Points(setup.samples),
            batch_size=setup.batch_size,
            sampler=EpochSampler(Points(setup.samples), num_replicas=1, rank=0, seed=5),
        )
    elif name == "batch_norm":
        s.model["batch_norm"] = True
    elif name == "finetuning_bn":  # epochs 0 frozen, 1 the last stage trains, 2-3 all of it
        s.epochs = 4
        s.model.update(trainable_only=True, batch_norm=True, deep=True)
        s.after.append(Milestones())
    elif name == "lr_finder":
        s.datamodule = True
        s.after.append(LearningRateFinder(min_lr=1e-4, max_lr=1e-1, num_training_steps=8))
    elif name == "batch_size_finder":  # tries 4 and 8, and takes 8
        s.datamodule, s.batch_size = True, 4
        s.after.append(BatchSizeFinder(init_val=4, max_trials=2, steps_per_trial=2))
    elif name == "stateful_onecycle":  # Lightning #21765: the loader made by estimated_stepping_batches
        from torchdata.stateful_dataloader import StatefulDataLoader

        s.model["schedule"] = "onecycle"
        s.train = lambda setup: StatefulDataLoader(
            Points(setup.samples), batch_size=setup.batch_size, shuffle=True
        )
    elif name == "combined_loaders":

        def two(setup: Setup) -> dict[str, DataLoader]:
            short = DataLoader(Points(24, seed=1), batch_size=8, shuffle=True)  # 3 batches
            long = DataLoader(Points(64, seed=2), batch_size=8, shuffle=True)  # 8 batches
            return {"short": short, "long": long}

        s.train = two
    elif name in ("accumulate_steps", "accumulate_minutes"):
        s.batch_size, s.trainer["accumulate_grad_batches"] = 4, 3  # 12 batches, 4 steps an epoch
        s.every = 1
        if name == "accumulate_minutes":
            s.every, s.every_minutes = None, 1e-6  # every batch end whose step is new
    elif name in ("iterable_global", "iterable_generator"):
        stream = Stream(s.samples, own_generator=name.endswith("generator"))
        s.train = lambda setup: DataLoader(stream, batch_size=setup.batch_size)
    elif name == "persistent_workers":
        s.train = lambda setup: DataLoader(
            Points(setup.samples, augment=True),
            batch_size=setup.batch_size,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
        )
    elif name == "swa_bn":
        s.epochs = 4  # SWA in epochs 1-3 (swa_epoch_start counts from 1), the BatchNorm update in epoch 4
        s.model["batch_norm"] = True
        s.after.append(StochasticWeightAveraging(swa_lrs=5e-3, swa_epoch_start=2))
    elif name == "val_step_logging":
        s.model["val_on_step"] = True
        s.trainer["val_check_interval"] = 0.5
    elif name == "lr_monitor":
        s.after.append(LearningRateMonitor(logging_interval="step"))
    elif name == "grad_clip":
        s.trainer.update(gradient_clip_val=0.5, gradient_clip_algorithm="norm")
    elif name == "user_ckpt_every_n":
        s.after.append(ModelCheckpoint(every_n_train_steps=3))
    elif name == "val_check_int":
        s.trainer["val_check_interval"] = 4
    elif name == "early_stopping":
        s.epochs = 4  # validation every 3 steps; it stops at step 14, the first gain under 0.45
        s.trainer["val_check_interval"] = 0.5
        s.after.append(EarlyStopping(monitor="val_loss", patience=1, min_delta=0.45))
    elif name == "manual_two_opt":
        s.model["manual"] = True
    elif name == "onecycle":
        s.model["schedule"] = "onecycle"
        s.trainer.update(gradient_clip_val=1.0)
    elif name == "timer":
        s.trainer["max_time"] = {"hours": 1}
    elif name != "plain":
        raise SystemExit(f"unknown case {name!r}")
    return s


CASES = (
    "plain",
    "user_save_last_before",
    "user_save_last_after",
    "user_save_last_ours_first",
    "ckpt_best_default",
    "ckpt_best_user",
    "finetuning",
    "finetuning_bn",
    "dist_sampler",
    "batch_norm",
    "lr_finder",
    "batch_size_finder",
    "stateful_onecycle",
    "combined_loaders",
    "accumulate_steps",
    "accumulate_minutes",
    "iterable_global",
    "iterable_generator",
    "persistent_workers",
    "swa_bn",
    "val_step_logging",
    "lr_monitor",
    "grad_clip",
    "user_ckpt_every_n",
    "val_check_int",
    "early_stopping",
    "manual_two_opt",
    "onecycle",
    "timer",
)


def _kill() -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the job and its loader workers (a session of its own)
    os.kill(os.getpid(), signal.SIGKILL)


class Kill(pl.Callback):
    """SIGKILL the process group at the first ``place`` at or after global step ``step`` (see above)."""

    def __init__(self, step: int, place: str) -> None:
        self.step, self.place = step, place

    def _say(self, trainer: pl.Trainer, what: str) -> None:
        print(f"KILL {what} epoch={trainer.current_epoch} step={trainer.global_step}", flush=True)
        _kill()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        total = trainer.fit_loop.epoch_loop.total_batch_idx
        counted = {"step": trainer.global_step, "sigterm": trainer.global_step}.get(self.place, total)
        if counted != self.step:
            return
        if self.place in ("sigterm", "sigterm_batch"):
            print(f"SIGTERM step={trainer.global_step} batch={total}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        elif self.place in ("step", "batch"):
            self._say(trainer, "step" if self.place == "step" else f"batch {total}")

    def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.place == "val" and not trainer.sanity_checking and trainer.global_step >= self.step:
            self._say(trainer, "val")


class KillAtEpochEnd(Checkpoint):
    """SIGKILL the process group at the end of ``on_train_epoch_end`` of the first epoch that ends at or
    after global step ``step``: after every callback's, the monitoring ones and the user's checkpoint
    callbacks included (a ``Checkpoint``, listed last: Lightning calls it after all other checkpoint
    callbacks), and before ``RequeueCheckpoint`` writes the epoch's boundary as the next epoch starts."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_epoch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            print(f"KILL epoch_end epoch={trainer.current_epoch} step={trainer.global_step}", flush=True)
            _kill()


def _digest(tensors: Any) -> str:
    h = hashlib.sha1()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:10]


def _tensors(batch: Batch) -> list[torch.Tensor]:
    if isinstance(batch, dict):
        return [t for _, part in sorted(batch.items()) for t in _tensors(part)]
    return [t for t in batch if torch.is_tensor(t)]


class Mutate(Checkpoint):
    """Corrupt one piece of a resumed run's restored state: what the self-check must name. Test-only
    sabotage. A ``Checkpoint`` listed after ``RequeueCheckpoint``: Lightning calls it after it, so after
    lightning_resume's restore in every hook (a plain callback runs before and is undone by it)."""

    def __init__(self, kind: str) -> None:
        self.kind, self.done = kind, False

    def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        optimizer = trainer.optimizers[0]
        kind, fetcher = self.kind, trainer.fit_loop._data_fetcher
        if kind == "batch":  # the data one batch further on
            assert fetcher is not None and fetcher.iterator is not None
            next(fetcher.iterator)
        elif kind == "frozen":
            next(pl_module.parameters()).requires_grad_(False)
        elif kind == "bn_flag":
            pl_module.backbone[1].track_running_stats = False
        elif kind == "eval":
            pl_module.backbone.eval()
        elif kind == "scheduler":
            trainer.lr_scheduler_configs[0].scheduler.step()
        elif kind == "adam_moments":
            for state in optimizer.state.values():
                state["exp_avg"].zero_()
                state["exp_avg_sq"].zero_()
        elif kind == "param_group":  # the last group gone, with its parameters' states
            for parameter in optimizer.param_groups.pop()["params"]:
                optimizer.state.pop(parameter, None)
        elif kind == "loop_counters":  # the optimizer steps counted from 0 again
            steps = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step
            steps.total.completed = 0

    def sabotage_restores(self) -> None:
        """The random state or the held gradients not (wholly) put back: lightning_resume's own restore
        made to miss one part (a draw right after the random state goes back; gradients kept out)."""
        draws = {"python_rng": random.random, "numpy_rng": np.random.rand, "torch_rng": lambda: torch.rand(1)}
        if self.kind in draws:
            restore, draw = rng.restore, draws[self.kind]

            def restore_but_draw(state: dict[str, Any]) -> None:
                restore(state)
                draw()

            rng.restore = restore_but_draw  # type: ignore[assignment]
        elif self.kind == "grads":
            held_grads.restore = lambda module, grads: True  # type: ignore[assignment]


MUTATIONS = (
    "batch",
    "sampler_epoch",
    "frozen",
    "bn_flag",
    "eval",
    "scheduler",
    "adam_moments",
    "param_group",
    "python_rng",
    "numpy_rng",
    "torch_rng",
    "grads",
    "loop_counters",
)


class Trace(pl.Callback):
    """One line per training batch to ``path``: what the step starts from and trains on."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.first: int | None = None
        self.batches = 0

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Batch, batch_idx: int
    ) -> None:
        if self.first is None:
            self.first = trainer.global_step
            print(f"FIRST_STEP step={trainer.global_step} epoch={trainer.current_epoch}", flush=True)
        self.batches += 1
        lrs = [round(g["lr"], 12) for opt in trainer.optimizers for g in opt.param_groups]
        trainable = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        line = {
            "pid": os.getpid(),
            "epoch": trainer.current_epoch,
            "batch": batch_idx,
            "step": trainer.global_step,
            "data": _digest(_tensors(batch)),
            "weights": _digest(pl_module.parameters()),
            "lrs": lrs,
            "trainable": trainable,
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


def _rows(logger: CSVLogger) -> list[dict[str, str]]:
    path = Path(logger.log_dir) / "metrics.csv"
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--case", required=True, choices=CASES)
    p.add_argument("--kill-at", type=int, default=None, help="a global step (--kill-in batch: a batch)")
    places = ["step", "batch", "epoch_end", "val", "sigterm", "sigterm_batch"]
    p.add_argument("--kill-in", choices=places, default="step")
    p.add_argument("--plain", action="store_true", help="Lightning alone, none of our callbacks")
    p.add_argument("--mutate", choices=MUTATIONS, default=None, help="corrupt this restored state")
    args = p.parse_args(argv)

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[lightning_resume] %(levelname)s %(message)s"))
    logging.getLogger("lightning_resume").addHandler(handler)
    logging.getLogger("lightning_resume").setLevel(logging.INFO)
    pl.seed_everything(1234, workers=True)
    setup = _case(args.case)
    trace = Trace(args.out + ".trace")
    if args.plain:
        run_dir = None
        callbacks: list[pl.Callback] = [*setup.before, *setup.after, trace]
    else:
        run_dir = RunDir(root=args.root)
        ours = RequeueCheckpoint(every_n_train_steps=setup.every, every_n_minutes=setup.every_minutes)
        callbacks = [*setup.before, ours, *setup.after, run_dir, LocalLoggerResume(), trace]
    if args.kill_in.startswith("sigterm"):
        callbacks.append(PreemptionHandler(requeue=False))
    EpochSampler.OFF = int(args.mutate == "sampler_epoch")
    if args.mutate:
        callbacks.append(Mutate(args.mutate))
        callbacks[-1].sabotage_restores()
    if args.kill_in == "epoch_end" and args.kill_at is not None:
        callbacks.append(KillAtEpochEnd(args.kill_at))
    elif args.kill_at is not None:
        callbacks.insert(0, Kill(args.kill_at, args.kill_in))
    logger = CSVLogger(save_dir=run_dir.path if run_dir else args.root, name="csv")
    trainer = pl.Trainer(
        max_epochs=setup.epochs,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        default_root_dir=args.root,
        **setup.trainer,
    )
    model = Net(**setup.model)
    if setup.datamodule:
        trainer.fit(model, datamodule=Data(setup))
    else:
        train = (setup.train or _shuffled)(setup)
        val = DataLoader(Points(16, seed=3), batch_size=8)
        trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
    tested: dict[str, Any] = {}
    if setup.test:
        test = DataLoader(Points(16, seed=4), batch_size=8)
        for which in ("best", "last"):
            tested[which] = trainer.test(model, dataloaders=test, ckpt_path=which, verbose=False)
    torch.save(model.state_dict(), args.out)
    found = {
        "run_dir": str(run_dir.path) if run_dir else None,
        "resumed": run_dir.is_resumed if run_dir else False,
        "first_step": trace.first,
        "batches": trace.batches,
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "metrics": _rows(logger),
        "test": tested,
    }
    with open(args.out + ".json", "w") as f:
        json.dump(found, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
