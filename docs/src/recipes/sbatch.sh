#!/bin/bash
#SBATCH --job-name=train
#SBATCH --output=%x-%j.log
#SBATCH --ntasks=1
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --signal=USR1@120
#SBATCH --open-mode=append
##SBATCH --cpus-per-task=8
##SBATCH --gres=gpu:1
#
#   sbatch sbatch.sh [train.py arguments]
#
# --requeue            the job may be requeued: by PreemptionHandler (scontrol requeue), by a
#                      preemption with PreemptMode=REQUEUE, or after a node failure.
# --signal=USR1@120    SIGUSR1 to the job step 120 s before the time limit: PreemptionHandler saves
#                      last.ckpt at the next step, requeues the job and exits with status 143.
# --open-mode=append   the restarted job appends to the log instead of truncating it.
# ##SBATCH            disabled lines: remove one '#' to ask for CPUs (data loading) and a GPU.
#
# A requeued job keeps its SLURM_JOB_ID and gets SLURM_RESTART_COUNT=1, 2, ...: RunDir finds the run
# dir again and RequeueCheckpoint resumes from its last.ckpt. Run Python under srun: signals from
# --signal and `scancel --signal` are delivered to job steps, not to the batch shell.
srun python train.py "$@"
