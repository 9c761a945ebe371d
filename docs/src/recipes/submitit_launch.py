"""Submit train.py to SLURM with submitit.

    python submitit_launch.py [train.py arguments]

Run it from the folder that holds train.py: the job imports `train` from its working directory.
submitit has SLURM send its preempt signal (SIGUSR2) `slurm_signal_delay_s` before the time limit.
PreemptionHandler watches that signal and SIGTERM (which submitit itself only logs as "Bypassing
signal"), saves last.ckpt at the next step and lets submitit requeue the job. The requeued job keeps
its SLURM job id, so RunDir and RequeueCheckpoint resume from the checkpoint.
"""

from __future__ import annotations

import sys

import submitit
import train


class Train(submitit.helpers.Checkpointable):
    """`train.main` as a submitit job.

    Checkpointable, so that submitit requeues it after the time-limit signal as well: a plain function
    is requeued on a preemption only. The training state is in last.ckpt, not in this object.
    """

    def __call__(self, argv: list[str]) -> None:
        train.main(argv)


def main() -> None:
    executor = submitit.AutoExecutor(folder="submitit/%j")
    executor.update_parameters(
        name="train",
        timeout_min=240,  # submitit treats every signal of a job with timeout_min <= 10 as a time-out
        slurm_signal_delay_s=120,  # the preempt signal comes 120 s before the time limit
        nodes=1,
        tasks_per_node=1,
        # cpus_per_task=8,
        # gpus_per_node=1,
        # slurm_partition="gpu",
    )
    job = executor.submit(Train(), sys.argv[1:])
    print(f"submitted job {job.job_id}; log: {job.paths.stdout}")


if __name__ == "__main__":
    main()
