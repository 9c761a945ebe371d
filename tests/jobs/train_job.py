"""The end-to-end tests' training job: the demo's model and data, with every knob the tests turn.

Run as ``python tests/jobs/train_job.py --root DIR --out FILE``. It writes the final weights to
``FILE`` and ``{"run_dir": ..., "resumed": ...}`` to ``FILE.json``; ``--kill-at N`` SIGKILLs the
process at global step N, a preemption with no warning. Test-only scaffolding: it is not shipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from jobs.demo_model import Model as DemoModel
from jobs.demo_model import Noisy
from lightning_resume import (
    DurableCheckpointIO,
    MemoryTier,
    PreemptionHandler,
    RequeueCheckpoint,
    RunDir,
    SignalDiagnostics,
)
from lightning_resume._scheduler.environment import is_global_zero


class Model(DemoModel):
    """The demo's model; writes the sample indices of every training batch when asked to."""

    def __init__(self, sample_log: str | None = None) -> None:
        super().__init__()
        self.sample_log = sample_log

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.sample_log:
            index = batch[2]
            _append(f"{self.sample_log}.rank{self.global_rank}", " ".join(map(str, index.tolist())) + "\n")
        return super().training_step(batch, batch_idx)


class KillAt(pl.Callback):
    """SIGKILL at a global step on one rank: its whole process group, or (under torchrun, whose agent
    shares the group and restarts failed workers) only itself."""

    def __init__(self, step: int, rank: int, group: bool) -> None:
        self.step, self.rank, self.group = step, rank, group

    def on_train_batch_end(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step != self.step or trainer.global_rank != self.rank:
            return
        if self.group and trainer.world_size > 1:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class SlowValidation(Model):
    """The model with a validation step that takes ``val_sleep`` seconds."""

    def __init__(self, sample_log: str | None = None, val_sleep: float = 0.0) -> None:
        super().__init__(sample_log)
        self.val_sleep = val_sleep

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        time.sleep(self.val_sleep)
        super().validation_step(batch, batch_idx)


class Probe(pl.Callback):
    """Print the first step an attempt trains and every validation it finishes (the tests read them)."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.val_batches = 0

    def on_train_batch_start(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if self.first is None:
            self.first = trainer.global_step
            print(f"FIRST_STEP rank={trainer.global_rank} step={trainer.global_step}", flush=True)

    def on_validation_batch_end(self, *args) -> None:  # type: ignore[no-untyped-def]
        self.val_batches += 1

    def on_validation_end(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_rank == 0:
            sanity, step = trainer.sanity_checking, trainer.global_step
            print(f"VAL_DONE sanity={sanity} step={step} batches={self.val_batches}", flush=True)
        self.val_batches = 0


class Sabotage(pl.Callback):
    """Break a restart on purpose, for the self-check to catch: ``frozen`` freezes the first parameter;
    ``batch-off`` makes the resumed epoch skip one batch fewer (the loader one batch off)."""

    def __init__(self, how: str) -> None:
        self.how, self.done = how, False

    def on_load_checkpoint(self, trainer, pl_module, checkpoint) -> None:  # type: ignore[no-untyped-def]
        state = checkpoint["callbacks"].get("ExactResume")
        if self.how == "batch-off" and state and state.get("batches"):
            state["batches"] -= 1

    def on_train_batch_start(self, trainer, pl_module, *args) -> None:  # type: ignore[no-untyped-def]
        # After RequeueCheckpoint put requires_grad back (at train start), before the first step.
        if self.how == "frozen" and trainer.ckpt_path and not self.done:
            next(pl_module.parameters()).requires_grad_(False)
            self.done = True


def send(sig: signal.Signals, group: bool) -> None:
    """``sig`` to this process, or to its whole process group from another process (as a scheduler does)."""
    if group:
        # The sender runs in a session of its own, or it would be in the group it signals.
        command = ["kill", "-s", sig.name.removeprefix("SIG"), "--", f"-{os.getpgrp()}"]
        subprocess.run(command, check=True, start_new_session=True)
    else:
        os.kill(os.getpid(), sig)


class SignalAt(pl.Callback):
    """Send a real signal as the step after ``step`` starts, on one rank (or all).

    With ``count > 1`` the further signals arrive while the next checkpoint is being written.
    """

    def __init__(self, step: int, name: str, rank: int | None, count: int, group: bool = False) -> None:
        self.step, self.sig, self.rank, self.remaining = step, signal.Signals[name], rank, count
        self.group, self.sent = group, False

    def _send(self) -> None:
        self.remaining -= 1
        self.sent = True
        send(self.sig, self.group)

    def on_train_batch_start(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank) and self.remaining:
            self._send()

    def on_save_checkpoint(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        # Only the rank that got the first signal gets the further ones.
        if self.sent and self.remaining:
            self._send()


class SignalIn(pl.Callback):
    """SIGTERM from inside fit's validation (at validation batch ``k`` after training step ``step``),
    the sanity check (at its batch ``k``), or a slow ``on_train_epoch_end`` of a user callback."""

    def __init__(self, where: str, step: int, k: int, rank: int | None, epoch_end_sleep: float) -> None:
        self.where, self.step, self.k, self.rank = where, step, k, rank
        self.epoch_end_sleep = epoch_end_sleep
        self.sent_at_batch: int | None = None
        self.sent = time.monotonic()

    def _send(self, trainer, what: str, batch: int | None = None) -> None:  # type: ignore[no-untyped-def]
        if self.sent_at_batch is not None or self.rank not in (None, trainer.global_rank):
            return
        self.sent_at_batch, self.sent = batch if batch is not None else -1, time.monotonic()
        print(f"SIGNAL {what} rank={trainer.global_rank} step={trainer.global_step}", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:  # type: ignore[no-untyped-def]
        if batch_idx != self.k:
            return
        if self.where == "sanity" and trainer.sanity_checking:
            self._send(trainer, "sanity", batch_idx)
        elif self.where == "val" and not trainer.sanity_checking and trainer.global_step >= self.step:
            self._send(trainer, f"val batch {batch_idx}", batch_idx)

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:  # type: ignore[no-untyped-def]
        if self.sent_at_batch is not None and self.sent_at_batch >= 0:
            print(f"VAL_BATCH_AFTER_SIGNAL {batch_idx - self.sent_at_batch}", flush=True)

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # type: ignore[no-untyped-def]
        if self.where == "epoch_end" and trainer.global_step >= self.step:
            self._send(trainer, "epoch_end")
            time.sleep(self.epoch_end_sleep)  # a long user epoch-end job

    def on_exception(self, trainer, pl_module, exception) -> None:  # type: ignore[no-untyped-def]
        if self.sent_at_batch is not None:
            print(f"STOPPED {type(exception).__name__} {time.monotonic() - self.sent:.3f}s", flush=True)


class Slow(pl.Callback):
    """Sleep after every step, so a scheduler has time to act in the middle of training."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args) -> None:  # type: ignore[no-untyped-def]
        time.sleep(self.seconds)


def loader(
    kind: str, ds: Dataset, batch_size: int, shuffle: bool, workers: int = 0, drop_last: bool = False
) -> DataLoader:
    options: dict[str, Any] = {
        "batch_size": batch_size,
        "shuffle": shuffle,
        "num_workers": workers,
        "drop_last": drop_last,
    }
    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(ds, **options)
    return DataLoader(ds, **options)


def _append(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


# -- preemption notices (tests/preemption/test_notices.py) ------------------------------------------


def add_notice_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--notice", action="append", default=[], help="aws=URL, gce=URL, azure=URL or file=PATH")
    p.add_argument("--on-notice", default="save_and_continue")
    p.add_argument("--notice-margin", type=float, default=15.0)
    p.add_argument("--notice-interval", type=float, default=0.05, help="seconds between two polls")
    p.add_argument("--announce-at", type=int, default=None, help="rank 0 announces a notice after this step")
    p.add_argument("--announce-url", default=None, help="... by a POST to this URL (a fake metadata server)")
    p.add_argument("--announce-file", default=None, help="... by writing this file")
    p.add_argument("--announce-deadline", type=float, default=None, help="seconds to the file's deadline")
    p.add_argument("--announce-val-batch", type=int, default=None, help="... in validation, at this batch")
    p.add_argument("--print-saves", action="store_true", help="print SAVED rank=R step=S at every save")


def notice_options(args: argparse.Namespace) -> dict[str, Any]:
    """``PreemptionHandler(notices=Notices(...))`` for the notice knobs (no source given: ``"auto"``)."""
    from lightning_resume.notices import AwsSpotNotice, AzureNotice, FileNotice, GceNotice, Notices

    kinds = {"aws": AwsSpotNotice, "gce": GceNotice, "azure": AzureNotice}
    sources: list[Any] = []
    for spec in args.notice:
        kind, _, where = spec.partition("=")
        if kind == "file":
            sources.append(FileNotice(where, interval=args.notice_interval))
        else:
            sources.append(kinds[kind](endpoint=where, interval=args.notice_interval, timeout=1.0))
    notices = Notices(sources or "auto", on_notice=args.on_notice, margin=args.notice_margin)
    return {"notices": notices}


class Announce(pl.Callback):
    """The provider announces a preemption after ``step`` (rank 0): a fake metadata server is told, or
    the notice file is written (atomically, with its deadline)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.done = args, False

    def on_train_batch_end(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if self.args.announce_val_batch is None:
            self._announce(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:  # type: ignore[no-untyped-def]
        if batch_idx == self.args.announce_val_batch and not trainer.sanity_checking:
            self._announce(trainer)

    def _announce(self, trainer) -> None:  # type: ignore[no-untyped-def]
        if self.done or trainer.global_step != self.args.announce_at or trainer.global_rank != 0:
            return
        self.done = True
        print(f"ANNOUNCED step={trainer.global_step} time={time.time():.3f}", flush=True)
        if self.args.announce_url:
            import urllib.request

            urllib.request.urlopen(urllib.request.Request(self.args.announce_url, method="POST"), timeout=5)
        if self.args.announce_file:
            deadline = self.args.announce_deadline
            content = f"{time.time() + deadline:.3f}\n" if deadline is not None else ""
            with open(self.args.announce_file + ".tmp", "w") as f:
                f.write(content)
            os.replace(self.args.announce_file + ".tmp", self.args.announce_file)


class PrintSaves(pl.Callback):
    """Print the step of every checkpoint each rank takes part in."""

    def on_save_checkpoint(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        print(f"SAVED rank={trainer.global_rank} step={trainer.global_step}", flush=True)


def notice_callbacks(args: argparse.Namespace) -> list[pl.Callback]:
    found: list[pl.Callback] = [Announce(args)] if args.announce_at is not None else []
    return [*found, PrintSaves()] if args.print_saves else found


# -- end of preemption notices ---------------------------------------------------------------------

# -- another number of ranks (tests/exact_resume/test_world_change.py) ----------------------------------


def add_world_size_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epoch-log", default=None, help="write 'epoch step ranks: indices' per batch and rank")
    p.add_argument("--nodes-from-env", action="store_true", help="num_nodes from an elastic torchrun's env")
    p.add_argument(
        "--kill-node-at", type=int, default=None, help="SIGKILL this node (agent too) after a step"
    )
    p.add_argument(
        "--keep-global-batch", action="store_true", help="RequeueCheckpoint(keep_global_batch=True)"
    )
    p.add_argument("--accumulate", type=int, default=1, help="Trainer(accumulate_grad_batches=...)")
    p.add_argument("--no-dropout", action="store_true", help="a model that draws no random numbers")
    p.add_argument("--own-sampler", action="store_true", help="a DistributedSampler of ours (torchrun only)")


class EpochLog(pl.Callback):
    """Write the epoch, global step, number of ranks and sample indices of every training batch."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        where = f"{trainer.current_epoch} {trainer.global_step} {trainer.world_size}"
        _append(
            f"{self.path}.rank{trainer.global_rank}", f"{where}: {' '.join(map(str, batch[2].tolist()))}\n"
        )


class KillNode(pl.Callback):
    """SIGKILL this node after a global step: the torchrun agent (the parent; its workers run in
    sessions of their own), then this process's group."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step == self.step:
            print(f"KILL_NODE rank={trainer.global_rank} step={trainer.global_step}", flush=True)
            os.kill(os.getppid(), signal.SIGKILL)
            os.killpg(os.getpgrp(), signal.SIGKILL)


def world_size_setup(args: argparse.Namespace, callbacks: list[pl.Callback]) -> None:
    """Apply the knobs that come before the Trainer: nodes from the environment, callbacks."""
    if args.nodes_from_env:  # an elastic job: as many nodes as the rendezvous admitted
        args.nodes = int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"])
    if args.epoch_log:
        callbacks.append(EpochLog(args.epoch_log))
    if args.kill_node_at is not None and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        callbacks.insert(0, KillNode(args.kill_node_at))


def world_size_model(model: pl.LightningModule, args: argparse.Namespace) -> pl.LightningModule:
    if args.no_dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    return model


def world_size_loader(args: argparse.Namespace, train: Dataset, made: DataLoader) -> DataLoader:
    """``--own-sampler``: the train loader with a ``DistributedSampler`` made here, from torchrun's env."""
    if not args.own_sampler:
        return made
    ranks, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    sampler = DistributedSampler(train, num_replicas=ranks, rank=rank, shuffle=True, seed=4321)
    return DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=args.drop_last)


# -- end of another number of ranks ----------------------------------------------------------------
# -- epoch boundaries, logged metrics, data draws (issues 21, 22) ----------------------------------


def add_epoch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--monitor", action="store_true", help="EarlyStopping + ModelCheckpoint on val_loss")
    p.add_argument("--patience", type=int, default=1, help="--monitor: EarlyStopping's patience")
    p.add_argument("--plateau", action="store_true", help="ReduceLROnPlateau on val_loss (no StepLR)")
    p.add_argument("--metrics", action="store_true", help="torchmetrics and self.log(on_epoch=True)")
    p.add_argument("--csv", action="store_true", help="CSVLogger in the run dir, with LocalLoggerResume")
    p.add_argument("--max-steps", type=int, default=None, help="Trainer(max_steps=N), no max_epochs")
    p.add_argument("--min-steps", type=int, default=None, help="Trainer(min_steps=N)")
    p.add_argument("--stop-at", type=int, default=None, help="a callback asks to stop once, after step N")
    p.add_argument("--no-seed-workers", action="store_true", help="seed_everything(workers=False)")
    p.add_argument("--draw-log", default=None, help="write every batch's augmentation draws here")
    p.add_argument("--step-log", default=None, help="write each step's weights/RNG/LR digest here, per rank")


class Metered(SlowValidation):
    """The model with what a real project logs: torchmetrics objects and ``self.log(on_epoch=True)``."""

    def __init__(self, sample_log: str | None, val_sleep: float, plateau: bool, draw_log: str | None) -> None:
        super().__init__(sample_log, val_sleep)
        import torchmetrics

        self.plateau, self.draw_log = plateau, draw_log
        self.train_mse = torchmetrics.MeanSquaredError()
        self.train_mean = torchmetrics.MeanMetric()
        self.val_mse = torchmetrics.MeanSquaredError()

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y, index = batch
        if self.draw_log:  # what the augmentation drew: the batch's inputs, as the step sees them
            _append(
                f"{self.draw_log}.rank{self.global_rank}", f"{x.sum().item():.10e} {torch.rand(1).item()}\n"
            )
        loss = super().training_step(batch, batch_idx)
        self.train_mse(self.net(x), y)
        self.train_mean(loss.detach())
        self.log("train/mse", self.train_mse, on_step=False, on_epoch=True)
        self.log("train/mean_loss", self.train_mean, on_step=False, on_epoch=True)
        self.log("train/loss_epoch", loss, on_step=False, on_epoch=True)
        self.log("train/index_sum", index.sum().float(), on_step=False, on_epoch=True, reduce_fx="sum")
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        x, y, _ = batch
        self.val_mse(self.net(x), y)
        self.log("val/mse", self.val_mse, on_epoch=True)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        if not self.plateau:
            return super().configure_optimizers()
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}


class StopAt(pl.Callback):
    """Ask the Trainer to stop once, at the end of a step (as ``EarlyStopping`` does when its metric
    has stalled, before improving again); with ``min_steps`` Lightning trains on until it is met."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step == self.step:
            trainer.should_stop = True


def epoch_callbacks(args: argparse.Namespace, run_dir: RunDir) -> list[pl.Callback]:
    """EarlyStopping and ModelCheckpoint on ``val_loss`` (``--monitor``); ``LocalLoggerResume``
    (``--csv``)."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from lightning_resume import LocalLoggerResume

    found: list[pl.Callback] = [StopAt(args.stop_at)] if args.stop_at is not None else []
    if args.monitor:
        found.append(EarlyStopping(monitor="val_loss", patience=args.patience, min_delta=1e-3))
        best = ModelCheckpoint(
            dirpath=run_dir.path / "best", monitor="val_loss", save_top_k=2, filename="{epoch}-{step}"
        )
        found.append(best)
    if args.csv:
        found.append(LocalLoggerResume())
    return found


def epoch_logger(args: argparse.Namespace, run_dir: RunDir) -> Any:
    from lightning.pytorch.loggers import CSVLogger

    return CSVLogger(save_dir=run_dir.path, name="csv") if args.csv else False


def write_epoch_outcome(args: argparse.Namespace, trainer: pl.Trainer) -> None:
    """``FILE.callbacks.json``: what EarlyStopping and ModelCheckpoint decided (``--monitor``)."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    found: dict[str, Any] = {"global_step": trainer.global_step, "epoch": trainer.current_epoch}
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, EarlyStopping):
            state = callback.state_dict()
            found["early_stopping"] = {k: float(v) if torch.is_tensor(v) else v for k, v in state.items()}
        elif isinstance(callback, ModelCheckpoint) and not isinstance(callback, RequeueCheckpoint):
            found["best"] = {os.path.basename(k): float(v) for k, v in callback.best_k_models.items()}
            found["best_model"] = os.path.basename(callback.best_model_path)
    with open(args.out + ".callbacks.json", "w") as f:
        json.dump(found, f, indent=1, sort_keys=True)


class StepLog(pl.Callback):
    """Write, per rank, what each step starts from: weights, optimizer state, random state, learning
    rate, the batch's indices, and what each validation and epoch end leaves in ``callback_metrics``
    (a resumed run's log, from its first step on, must equal the uninterrupted run's)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _write(self, trainer, text: str) -> None:  # type: ignore[no-untyped-def]
        _append(f"{self.path}.rank{trainer.global_rank}", text + "\n")

    @staticmethod
    def _digest(tensors: Any) -> str:
        import hashlib

        h = hashlib.sha1()
        for t in tensors:
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:12]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        opt = trainer.optimizers[0]
        moments = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
        lr = opt.param_groups[0]["lr"]
        self._write(
            trainer,
            f"step {trainer.global_step} epoch {trainer.current_epoch} batch {batch_idx} lr {lr!r} "
            f"weights {self._digest(pl_module.parameters())} optim {self._digest(moments)} "
            f"rng {self._digest([torch.get_rng_state()])} samples {batch[2].tolist()}",
        )

    def _metrics(self, trainer, what: str) -> None:  # type: ignore[no-untyped-def]
        found = {k: float(v) for k, v in sorted(trainer.callback_metrics.items())}
        self._write(trainer, f"{what} step {trainer.global_step} epoch {trainer.current_epoch} {found}")

    def on_validation_end(self, trainer, pl_module) -> None:  # type: ignore[no-untyped-def]
        if not trainer.sanity_checking:
            self._metrics(trainer, "validated")

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # type: ignore[no-untyped-def]
        self._metrics(trainer, "epoch_end")

    def on_train_end(self, trainer, pl_module) -> None:  # type: ignore[no-untyped-def]
        self._write(trainer, f"end step {trainer.global_step} weights {self._digest(pl_module.parameters())}")


# -- end of epoch boundaries -----------------------------------------------------------------------

# A node-local checkpoint directory, expanded by the process that uses it.
LOCAL_CKPT = "$TMPDIR/ckpt"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--key", default=None)
    p.add_argument(
        "--kill-at",
        default=None,
        help="global step; a comma list (two or more) is indexed by TORCHELASTIC_RESTART_COUNT",
    )
    p.add_argument("--kill-rank", type=int, default=0, help="the rank that SIGKILLs its process group")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--every", type=lambda v: v if v == "auto" else int(v), default=2, help="N or auto")
    p.add_argument("--expect-every", type=float, default=None, help="expected_interruption_every (s)")
    p.add_argument("--loader", choices=["stateful", "plain"], default="stateful")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--ckpt-path", default=None)
    p.add_argument("--sample-log", default=None, help="write each training batch's sample indices here")
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--augment", action="store_true", help="random jitter inside the dataset")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--no-requeue", action="store_true", help="leave RequeueCheckpoint out")
    p.add_argument("--no-epoch-end", action="store_true", help="no epoch-end save")
    p.add_argument(
        "--tracker", choices=["trackio"], default=None, help="log to trackio, resumed by TrackioResume"
    )
    p.add_argument("--preemption", action="store_true", help="add PreemptionHandler and SignalDiagnostics")
    p.add_argument(
        "--signal-at", type=int, default=None, help="send a signal as this step's next batch starts"
    )
    p.add_argument("--signal-name", default="SIGTERM")
    p.add_argument("--signal-rank", type=int, default=None)
    p.add_argument("--signal-count", type=int, default=1)
    p.add_argument("--signal-group", action="store_true", help="signal the process group from outside")
    p.add_argument("--signal-in", choices=["val", "sanity", "epoch_end"], default=None)
    p.add_argument("--signal-step", type=int, default=0, help="--signal-in val: a validation after this step")
    p.add_argument("--signal-k", type=int, default=0, help="--signal-in val/sanity: at this validation batch")
    p.add_argument("--epoch-end-sleep", type=float, default=0.0)
    p.add_argument("--val-samples", type=int, default=32)
    p.add_argument("--val-batch-size", type=int, default=16)
    p.add_argument("--val-sleep", type=float, default=0.0, help="seconds per validation batch")
    p.add_argument("--val-check-interval", type=int, default=None, help="validate every N training batches")
    p.add_argument("--val-workers", type=int, default=0)
    p.add_argument("--sanity", type=int, default=2, help="num_sanity_val_steps")
    p.add_argument("--step-sleep", type=float, default=0.0, help="sleep after each step (a slow job)")
    p.add_argument("--setup-sleep", type=float, default=0.0, help="sleep before fit (a slow setup window)")
    p.add_argument("--before", choices=["ignore", "user"], default=None, help="SIGTERM handler before ours")
    p.add_argument("--durable", action="store_true", help="save through DurableCheckpointIO (asynchronous)")
    p.add_argument("--mirror", default=None, help="DurableCheckpointIO(mirror=URL)")
    p.add_argument("--memory", default=None, help="DurableCheckpointIO(memory=MemoryTier(path=PATH))")
    p.add_argument("--replicas", type=int, default=1, help="--memory: MemoryTier(replicas=N)")
    p.add_argument("--durable-every", type=int, default=1000, help="--memory: MemoryTier(durable_every=N)")
    p.add_argument("--nodes", type=int, default=1, help="Trainer(num_nodes=...)")
    p.add_argument("--strategy", default="ddp", help="Trainer(strategy=...) with several ranks")
    p.add_argument("--local-ckpt", action="store_true", help="last.ckpt in $TMPDIR/ckpt (node-local)")
    p.add_argument("--rank0-delay", type=float, default=0.0, help="global rank 0 waits before RunDir")
    p.add_argument("--sabotage", choices=["frozen", "batch-off"], default=None, help="break a restart")
    add_notice_arguments(p)
    add_world_size_arguments(p)
    add_epoch_arguments(p)
    args = p.parse_args(argv)

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[lightning_resume] %(levelname)s %(message)s"))
    logging.getLogger("lightning_resume").addHandler(handler)
    logging.getLogger("lightning_resume").setLevel(logging.INFO)
    pl.seed_everything(1234, workers=not args.no_seed_workers)
    if args.before == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif args.before == "user":
        signal.signal(signal.SIGTERM, lambda *_: _append(args.out + ".user-handler", "called\n"))
    if args.rank0_delay and is_global_zero(os.environ):
        time.sleep(args.rank0_delay)  # a slow node: the other ranks look for the run dir first
    run_dir = RunDir(root=args.root, key=args.key)
    callbacks: list[pl.Callback] = [run_dir]
    if not args.no_requeue:
        callbacks.insert(
            0,
            RequeueCheckpoint(
                every_n_train_steps=args.every or None,
                expected_interruption_every=args.expect_every,
                save_on_train_epoch_end=not args.no_epoch_end,
                dirpath=LOCAL_CKPT if args.local_ckpt else None,
                keep_global_batch=args.keep_global_batch,
            ),
        )
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if args.kill_at is not None:
        kills = [int(step) for step in str(args.kill_at).split(",")]
        attempt = int(restart or 0) if len(kills) > 1 else 0
        if attempt < len(kills):
            callbacks.insert(0, KillAt(kills[attempt], args.kill_rank, group=restart is None))
    if args.step_sleep:
        callbacks.insert(0, Slow(args.step_sleep))
    if args.preemption:
        callbacks.extend([PreemptionHandler(**notice_options(args)), SignalDiagnostics()])
    if args.signal_at is not None:
        callbacks.insert(
            0,
            SignalAt(
                args.signal_at, args.signal_name, args.signal_rank, args.signal_count, args.signal_group
            ),
        )
    if args.signal_in is not None:
        where = SignalIn(
            args.signal_in, args.signal_step, args.signal_k, args.signal_rank, args.epoch_end_sleep
        )
        callbacks.insert(0, where)
    callbacks[:0] = notice_callbacks(args)
    world_size_setup(args, callbacks)
    callbacks.insert(0, Probe())
    if args.sabotage:
        callbacks.insert(0, Sabotage(args.sabotage))
    callbacks.extend(epoch_callbacks(args, run_dir))
    if args.step_log:
        callbacks.insert(1, StepLog(args.step_log))
    logger: Any = epoch_logger(args, run_dir)
    if args.tracker == "trackio":
        from lightning_resume import TrackioResume
        from lightning_resume.loggers import TrackioLogger

        logger = TrackioLogger(project="lightning-resume-demo", auto_log_cpu=False, auto_log_gpu=False)
        callbacks.append(TrackioResume())
    trainer = pl.Trainer(
        plugins=[
            DurableCheckpointIO(
                mirror=args.mirror,
                dirpath=LOCAL_CKPT if args.local_ckpt else None,
                memory=MemoryTier(args.memory, replicas=args.replicas, durable_every=args.durable_every)
                if args.memory
                else None,
            )
        ]
        if args.durable or args.mirror or args.memory
        else None,
        max_epochs=args.epochs if args.max_steps is None else None,
        max_steps=args.max_steps if args.max_steps is not None else -1,
        min_steps=args.min_steps,
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.nodes,
        strategy=args.strategy if args.devices * args.nodes > 1 else "auto",
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=1,
        enable_progress_bar=args.progress,
        enable_model_summary=False,
        deterministic=True,
        default_root_dir=args.root,
        val_check_interval=args.val_check_interval,
        num_sanity_val_steps=args.sanity,
        accumulate_grad_batches=args.accumulate,
        use_distributed_sampler=not args.own_sampler,
    )
    if args.setup_sleep:
        with open(args.out + ".setup", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(args.setup_sleep)
    train = Noisy(args.samples, augment=args.augment)
    validation = Noisy(args.val_samples)
    if args.metrics or args.plateau or args.draw_log:
        model: pl.LightningModule = Metered(args.sample_log, args.val_sleep, args.plateau, args.draw_log)
    else:
        model = SlowValidation(args.sample_log, args.val_sleep)
    trainer.fit(
        world_size_model(model, args),
        train_dataloaders=world_size_loader(
            args, train, loader(args.loader, train, args.batch_size, True, args.workers, args.drop_last)
        ),
        val_dataloaders=loader(args.loader, validation, args.val_batch_size, False, args.val_workers),
        ckpt_path=args.ckpt_path,
    )
    if trainer.is_global_zero:
        torch.save(trainer.lightning_module.state_dict(), args.out)
        with open(args.out + ".json", "w") as f:
            resumed, step = run_dir.is_resumed, trainer.global_step
            json.dump({"run_dir": str(run_dir.path), "resumed": resumed, "step": step}, f)
        if args.monitor:
            write_epoch_outcome(args, trainer)


if __name__ == "__main__":
    main(sys.argv[1:])
