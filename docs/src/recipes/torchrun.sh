#!/usr/bin/env bash
# Two processes on one machine (gloo on CPU, NCCL on GPUs) with TorchElastic restarts.
#
#   bash torchrun.sh [train.py arguments]
#
# When a worker fails, for example after a preemption signal (PreemptionHandler saves last.ckpt on
# every rank and exits with status 143), torchrun restarts all workers, up to --max-restarts times.
# TORCHELASTIC_RESTART_COUNT tells RunDir it is a restart, so the workers resume in the same run dir.
# A relaunch of torchrun itself (by SLURM, Kubernetes, by hand) gets a new TorchElastic run id: give
# it LIGHTNING_RESUME_KEY, or run it inside a SLURM job (the SLURM job id then wins).
set -euo pipefail

# A fresh rendezvous store for each restart round. With the shared store (torch's default), restarted
# workers can read the previous round's addresses: with torch 2.13 on CPU, a restart failed with
# "Gloo connectFullMesh failed ... Connection refused" until this was set.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1

exec torchrun --standalone --nproc-per-node 2 --max-restarts 3 \
    "$(dirname "$0")/train.py" --devices 2 "$@"
