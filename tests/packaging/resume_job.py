"""A kill-and-resume job for an installed lightning_resume, run from outside the checkout.

``python resume_job.py`` trains a small job once uninterrupted, then again SIGKILLed at two steps and
relaunched each time under the same session key, and exits 0 when every relaunch resumed from the last
save in the same run dir and the final weights are bitwise equal to the uninterrupted run's.
``python resume_job.py --root DIR --out FILE [--kill-at N]`` is one attempt. Only the public API of the
installed package: ``make test-wheel`` copies this file into an empty directory and runs it there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

EVERY = 2  # RequeueCheckpoint(every_n_train_steps=...)
KILLS = (5, 17)  # global steps, mid-epoch (12 steps an epoch): resumed from 4, then from 16


def attempt(root: str, out: str, kill_at: int | None) -> None:
    """One launch: train 3 epochs under RunDir and RequeueCheckpoint; SIGKILL itself at ``kill_at``."""
    import lightning.pytorch as pl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_resume import DurableCheckpointIO, PreemptionHandler, RequeueCheckpoint, RunDir

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    class Probe(pl.Callback):
        start_step = -1

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.start_step = trainer.global_step

        def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
            if trainer.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # a preemption with no warning

    pl.seed_everything(0, workers=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    loader = DataLoader(TensorDataset(x, x @ torch.randn(8, 1, generator=g)), batch_size=8, shuffle=True)
    run_dir, probe = RunDir(root=root), Probe()
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        callbacks=[probe, run_dir, RequeueCheckpoint(every_n_train_steps=EVERY), PreemptionHandler()],
        plugins=[DurableCheckpointIO(asynchronous=False)],  # each save done before the next step
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        default_root_dir=root,
    )
    trainer.fit(Model(), train_dataloaders=loader)
    torch.save(trainer.lightning_module.state_dict(), out)
    report = {"run_dir": str(run_dir.path), "resumed": run_dir.is_resumed, "start_step": probe.start_step}
    Path(out + ".json").write_text(json.dumps(report))


def start(work: Path, name: str, kill_at: int | None = None) -> subprocess.Popen[bytes]:
    """Start one attempt in a child process under session key ``name``, its output in ``name.log``."""
    env = {**os.environ, "LIGHTNING_RESUME_KEY": name}
    argv = [sys.executable, __file__, "--root", str(work / name), "--out", str(work / f"{name}.pt")]
    argv += [] if kill_at is None else ["--kill-at", str(kill_at)]
    with open(work / f"{name}.log", "a") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def main() -> int:
    """Train uninterrupted and preempted; print what happened; 0 when the preempted run resumed exactly."""
    import torch

    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        baseline = start(work, "baseline")  # meanwhile, the preempted run's attempts one after the other
        for kill_at in KILLS:
            status = start(work, "preempted", kill_at).wait()
            print(f"attempt killed at step {kill_at}: exit status {status}")
            if status != -signal.SIGKILL:
                problems.append(f"the attempt to be killed at step {kill_at} exited with status {status}")
        if start(work, "preempted").wait() != 0:
            problems.append("the last attempt of the preempted run failed")
        if baseline.wait() != 0:
            problems.append("the uninterrupted run failed")
        if problems:
            print((work / "baseline.log").read_text(), (work / "preempted.log").read_text(), sep="\n")
        else:
            report = json.loads((work / "preempted.pt.json").read_text())
            print(f"last attempt: resumed={report['resumed']} from step {report['start_step']}")
            if not report["resumed"] or report["start_step"] != KILLS[-1] // EVERY * EVERY:
                problems.append(f"the last attempt did not resume from the last save: {report}")
            runs = sorted(p.parent.name for p in (work / "preempted").rglob("run_meta.json"))
            if len(runs) != 1:
                problems.append(f"the attempts made {len(runs)} run dirs, not one: {runs}")
            base, resumed = (torch.load(work / f"{n}.pt") for n in ("baseline", "preempted"))
            equal = base.keys() == resumed.keys() and all(torch.equal(base[k], resumed[k]) for k in base)
            print(f"final weights bitwise equal to the uninterrupted run's: {equal}")
            if not equal:
                problems.append("the resumed run's final weights differ from the uninterrupted run's")
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root")
    parser.add_argument("--out")
    parser.add_argument("--kill-at", type=int)
    args = parser.parse_args()
    if args.root is None:
        sys.exit(main())
    attempt(args.root, args.out, args.kill_at)
