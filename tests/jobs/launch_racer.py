"""A launch that races others: constructs ``RunDir`` at the moment a shared barrier opens, many times.

Run as ``python -m jobs.launch_racer``; one JSON command per line on stdin, one JSON answer per line
on stdout. Test-only scaffolding (``tests/run_dir/test_run_dir_bad_inputs.py`` drives several at once):

- ``{"root": ..., "env": {...}, "barrier": FILE}``: apply ``env`` (scheduler variables, the key),
  answer ``{"ready": pid}``, wait for a shared lock on ``FILE`` (the driver holds it exclusively and
  lets go once every racer is waiting, so they all start within a millisecond), then construct
  ``RunDir(root)``: ``{"trains": run dir}``, or ``{"refused": message}`` on ``RunDirError``. The
  ``RunDir`` (and its lock) is kept, as a training attempt keeps it.
- ``{"fit": true}``: train two steps with the kept ``RunDir``; answer ``{"step": N}``.
- ``{"release": true}``: drop the ``RunDir`` (its lock goes with it); answer ``{"released": pid}``.

The process ends at the end of its input.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from typing import Any

from lightning_resume import RequeueCheckpoint, RunDir, RunDirError
from lightning_resume.run_dir.binding import PROCESS

SCHEDULER = ("LIGHTNING_RESUME_KEY", "SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_ARRAY_TASK_ID")


def answer(data: dict[str, Any]) -> None:
    print(json.dumps(data), flush=True)


def fit(run_dir: RunDir) -> int:
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel

    trainer = pl.Trainer(
        max_steps=2,
        limit_train_batches=4,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=run_dir.path,
        callbacks=[run_dir, RequeueCheckpoint(every_n_train_steps=1)],
    )
    trainer.fit(BoringModel())
    return trainer.global_step


def main() -> None:
    held: RunDir | None = None
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("release"):
            if held is not None:
                held._release()  # what the end of fit does: this attempt no longer trains there
            held = None
            answer({"released": os.getpid()})
            continue
        if command.get("fit"):
            assert held is not None
            answer({"step": fit(held)})
            continue
        for var in SCHEDULER:
            os.environ.pop(var, None)
        os.environ.update(command.get("env", {}))
        PROCESS.reset()
        barrier = os.open(command["barrier"], os.O_RDONLY)
        answer({"ready": os.getpid()})
        fcntl.flock(barrier, fcntl.LOCK_SH)
        os.close(barrier)
        try:
            held = RunDir(root=command["root"])
        except RunDirError as e:
            answer({"refused": str(e)})
            continue
        answer({"trains": str(held.path)})


if __name__ == "__main__":
    main()
