"""``lightning-resume doctor --emit SCHEDULER``: the scheduler configuration, to paste, that retries the exit
statuses of :data:`lightning_resume.failure_classes.TABLE` a retry can fix (never 137) and stops the rest."""

from __future__ import annotations

from collections.abc import Callable

from lightning_resume.failure_classes import FailureClass, by_exit_code, exit_codes

_HEAD = "# lightning-resume failure classes -> {} (`lightning-resume doctor --emit {}`)"


def _codes(codes: list[int]) -> str:
    return ", ".join(map(str, codes))


def _legend(which: bool | list[int]) -> str:
    """The exit statuses of the classes a retry can (``True``) or cannot fix, or those listed, with names."""
    codes = exit_codes(which) if isinstance(which, bool) else which
    return ", ".join(f"{code} {failure.label}" for code in codes if (failure := by_exit_code(code)))


def slurm() -> str:
    """``slurm.conf`` lines (``RequeueExit``, ``RequeueExitHold``) and the ``sbatch`` options they need."""
    return f"""{_HEAD.format("SLURM", "slurm")}
# slurm.conf, on every node, then `scontrol reconfigure`. A job that exits with a status a retry can
# fix is requeued; with one it cannot, requeued held (`scontrol release JOBID` once it is fixed).
#   requeued: {_legend(True)}
#   held:     {_legend(False)}
RequeueExit={",".join(map(str, exit_codes(True)))}
RequeueExitHold={",".join(map(str, exit_codes(False)))}
# The job script (requeueable; its last command `srun python train.py ...`, so that its exit status
# is the ranks', which agree on one class):
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=USR1@120
"""


def skypilot() -> str:
    """A task YAML's ``resources.job_recovery`` for ``sky jobs launch``."""
    return f"""{_HEAD.format("SkyPilot", "skypilot")}
# Managed jobs (`sky jobs launch`) recover a preempted cluster by themselves; these exit statuses
# are recovered too, uncounted, and any other failure ends the job (max_restarts_on_errors: 0).
# Never add 137: a kernel OOM kill would be retried for ever.
#   recovered: {_legend(True)}
#   not:       {_legend(False)}
resources:
  job_recovery:
    strategy: EAGER_NEXT_REGION
    max_restarts_on_errors: 0
    recover_on_exit_codes: [{_codes(exit_codes(True))}]
"""


_PREEMPTED = FailureClass.PREEMPTED.exit_code
#: What a Kubernetes Job counts against its backoffLimit: a retry can fix it, and it is no preemption.
_COUNTED = [code for code in exit_codes(True) if code != _PREEMPTED]


def _job_spec(indent: str) -> str:
    """A Job's ``podFailurePolicy`` and pod template, lines after the first indented by ``indent``."""
    rules = [("FailJob", exit_codes(False)), ("Ignore", [_PREEMPTED]), ("Count", _COUNTED)]
    lines = ["podFailurePolicy:", "  rules:"]
    for action, codes in rules:
        lines += [f"  - action: {action}", "    onExitCodes:", "      containerName: train"]
        lines += ["      operator: In", f"      values: [{_codes(codes)}]"]
    lines += ["  - action: Ignore", "    onPodConditions:", "    - type: DisruptionTarget"]
    lines += ["template:", "  spec:", "    restartPolicy: Never", "    containers:", "    - name: train"]
    lines += ["      image: your-image", '      command: ["python", "train.py"]']
    return f"\n{indent}".join(lines)


def kubernetes() -> str:
    """A ``batch/v1`` Job's ``podFailurePolicy``, and the same in a JobSet."""
    return f"""{_HEAD.format("Kubernetes", "kubernetes")}
# A Job: a preemption (143, or the pod evicted) is not counted against backoffLimit, a status a retry
# can fix is counted, one it cannot fails the Job at once. podFailurePolicy needs restartPolicy: Never.
#   Ignore:  {_legend([_PREEMPTED])}, a pod evicted (DisruptionTarget)
#   Count:   {_legend(_COUNTED)}
#   FailJob: {_legend(False)}
apiVersion: batch/v1
kind: Job
metadata:
  name: train
spec:
  backoffLimit: 6
  {_job_spec("  ")}
---
# The same in a JobSet: a Job failed by the policy fails the JobSet; any other failure restarts it.
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: train
spec:
  failurePolicy:
    maxRestarts: 6
    rules:
    - action: FailJobSet
      onJobFailureReasons: [PodFailurePolicy]
  replicatedJobs:
  - name: workers
    replicas: 1
    template:
      spec:
        backoffLimit: 0
        {_job_spec("        ")}
"""


def torchrun() -> str:
    """Advice for ``torchrun --max-restarts`` (torchrun cannot act on an exit status)."""
    return f"""{_HEAD.format("torchrun", "torchrun")}
# torchrun restarts every worker after any worker fails, whatever its exit status (it has no
# non-retriable status, pytorch#133877), and exits 1 itself once --max-restarts are used up: the
# scheduler around it never sees the class. Keep --max-restarts small, for what a retry can fix:
#   retry fixes: {_legend(True)}
#   it does not: {_legend(False)}
# (ProgressWatchdog stops an attempt with 93 once the last ones all failed without a new checkpoint.)
# To let the scheduler decide from the class, start one process per rank from it instead (srun, an
# indexed Job or JobSet) and give it the --emit snippet for that scheduler.
torchrun --nnodes=1 --nproc-per-node=4 --max-restarts=3 train.py
"""


#: The schedulers ``--emit`` knows, and what it prints for each.
EMITTERS: dict[str, Callable[[], str]] = {f.__name__: f for f in (slurm, skypilot, kubernetes, torchrun)}
