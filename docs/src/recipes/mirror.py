"""train.py with checkpoints on node-local disk and a copy on shared or object storage.

    LIGHTNING_RESUME_KEY=exp-1 python mirror.py --mirror s3://bucket/checkpoints --root /local/runs
    srun python mirror.py --mirror /shared/checkpoints --root "$TMPDIR/runs"      # SLURM

Every checkpoint is written to the local run dir (atomic, verified) and uploaded in the background
to <mirror>/<session key>. When the job restarts on a node whose disk does not have the run (a
requeue onto another node, a new pod), the newest verified checkpoints are downloaded into the new
run dir before `fit` and training continues from them. Needs `pip install "lightning-resume[remote]"`
for s3:// and other remote URLs; a plain path (a shared filesystem) needs nothing more.
"""

from __future__ import annotations

import argparse
import logging

import lightning.pytorch as pl
from train import Regression, RegressionData, parse_args

from lightning_resume import DurableCheckpointIO, PreemptionHandler, RequeueCheckpoint, RunDir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--mirror", required=True, help="fsspec URL or shared folder for the copies")
    ours, rest = parser.parse_known_args(argv)
    args = parse_args(rest)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pl.seed_everything(0)

    run_dir = RunDir(root=args.root)
    if run_dir.session_key is None:
        # The mirror is found again by the session key: a new run id on a new node would not match.
        raise SystemExit("mirror.py needs a session key: run it under SLURM or set LIGHTNING_RESUME_KEY")
    checkpoint_io = DurableCheckpointIO(
        mirror=f"{ours.mirror.rstrip('/')}/{run_dir.session_key}",  # one mirror folder per run
        dirpath=run_dir.checkpoint_dir,  # restored from the mirror now if the local copy is missing
        keep=2,
    )
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        devices=args.devices,
        deterministic=True,
        default_root_dir=run_dir.path,
        plugins=[checkpoint_io],
        callbacks=[run_dir, RequeueCheckpoint(every_n_train_steps=args.every), PreemptionHandler()],
        enable_progress_bar=False,
    )
    trainer.fit(Regression(step_sleep=args.step_sleep), datamodule=RegressionData())
    if trainer.is_global_zero:
        print(f"finished at step {trainer.global_step} in {run_dir.path}")


if __name__ == "__main__":
    main()
