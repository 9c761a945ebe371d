# ruff: noqa: E501  (the child program is a string; its lines are kept as they run)
"""Init overhead of the tracker resume callbacks, measured side by side.

For each tracker: one first attempt creates a run dir, a checkpoint and a sidecar; then restarts alternate
with and without the resume callback, each in a fresh process (a restart is a new process). Each restart
reports: time to construct the callbacks (incl. binding: sidecar read, checks, hand-back), time from there
to the first training step, and the time spent inside the resume callback's own hooks.

Run: WANDB_MODE=offline SWANLAB_MODE=offline HF_HUB_OFFLINE=1 python benchmarks/tracker_resume_overhead.py [repeats]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, time
t_start = time.perf_counter()
import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from lightning_resume import RequeueCheckpoint, RunDir, SwanLabResume, TrackioResume, WandbResume
from lightning_resume.trackers.tracker_resume import TrackerResume

tracker, use_resume, out = sys.argv[1], sys.argv[2] == "with", sys.argv[3]
spent = {"hooks": 0.0, "setup": 0.0, "saves": 0.0, "n_saves": 0}
for name in ("setup", "on_save_checkpoint", "state_dict", "load_state_dict"):
    original = getattr(TrackerResume, name)
    def timed(self, *a, __original=original, __name=name, **k):
        t = time.perf_counter()
        try:
            return __original(self, *a, **k)
        finally:
            dt = time.perf_counter() - t
            spent["hooks"] += dt
            if __name == "setup":
                spent["setup"] += dt
            if __name == "on_save_checkpoint":
                spent["saves"] += dt
                spent["n_saves"] += 1
    setattr(TrackerResume, name, timed)

# import the tracker before the clock starts: both variants pay it
if tracker == "wandb":
    import wandb
    from lightning.pytorch.loggers import WandbLogger
elif tracker == "swanlab":
    from swanlab.integration.pytorch_lightning import SwanLabLogger
else:
    import trackio
    from lightning_resume.loggers import TrackioLogger

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 1)
    def training_step(self, batch, i):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

class FirstStep(pl.Callback):
    t = None
    def on_train_batch_start(self, *a):
        if FirstStep.t is None:
            FirstStep.t = time.perf_counter()

t0 = time.perf_counter()
if tracker == "wandb":
    logger, resume = WandbLogger(project="bench", save_dir="trackers"), (WandbResume() if use_resume else None)
elif tracker == "swanlab":
    logger, resume = SwanLabLogger(project="bench", log_dir="trackers"), (SwanLabResume() if use_resume else None)
else:
    logger, resume = TrackioLogger(project="bench", auto_log_cpu=False), (TrackioResume() if use_resume else None)
callbacks = ([resume] if resume else []) + [RequeueCheckpoint(every_n_train_steps=2), RunDir(root="runs"), FirstStep()]
t1 = time.perf_counter()
x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
trainer = pl.Trainer(max_steps=int(os.environ.get("STEPS", "4")), max_epochs=None, accelerator="cpu", logger=logger,
                     callbacks=callbacks, log_every_n_steps=1, enable_progress_bar=False,
                     enable_model_summary=False, limit_val_batches=0)
trainer.fit(Model(), train_dataloaders=DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
run_id = {"wandb": lambda: logger.experiment.id, "swanlab": lambda: logger.experiment.id,
          "trackio": lambda: logger._finished_name}[tracker]()
json.dump({"construct": t1 - t0, "to_first_step": FirstStep.t - t0, "hooks": spent["hooks"],
           "setup": spent["setup"], "per_save": spent["saves"] / max(spent["n_saves"], 1),
           "run": str(run_id)}, open(out, "w"))
"""


def run(workdir: Path, tracker: str, variant: str, restart: int, steps: int) -> dict[str, float | str]:
    out = workdir / "t.json"
    env = dict(os.environ, SLURM_JOB_ID="1", TRACKIO_DIR=str(workdir / "trackio"), STEPS=str(steps))
    env.pop("SLURM_RESTART_COUNT", None)
    if restart:
        env["SLURM_RESTART_COUNT"] = str(restart)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, tracker, variant, str(out)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(out.read_text())


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print(
        f"{'tracker':8} {'variant':8} {'construct ms':>13} {'to 1st step ms':>15} {'own hooks ms':>13}"
        f" {'setup ms':>9} {'per ckpt ms':>12}  same run"
    )
    for tracker in ("wandb", "swanlab", "trackio"):
        results: dict[str, list[dict[str, float | str]]] = {"without": [], "with": []}
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            first = run(workdir, tracker, "with", 0, 2)  # first attempt: run dir, last.ckpt, sidecar
            restart = 0
            for _ in range(repeats):
                for variant in ("without", "with"):
                    restart += 1
                    results[variant].append(run(workdir, tracker, variant, restart, 2 + restart))
        for variant in ("without", "with"):
            rows = results[variant]
            keys = ("construct", "to_first_step", "hooks", "setup", "per_save")
            med = {k: statistics.median(float(r[k]) * 1000 for r in rows) for k in keys}
            same = sum(r["run"] == first["run"] for r in rows)
            print(
                f"{tracker:8} {variant:8} {med['construct']:13.2f} {med['to_first_step']:15.1f} {med['hooks']:13.2f}"
                f" {med['setup']:9.2f} {med['per_save']:12.2f}  {same}/{len(rows)}"
            )


if __name__ == "__main__":
    main()
