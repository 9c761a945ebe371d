"""``lightning-resume doctor --emit``: each snippet parsed back (``slurm.conf`` syntax, YAML, torchrun's own
argument parser) retries exactly the retryable classes' statuses and stops on the others (the real SLURM
acting on it: ``tests/slurm/test_requeue_exit_slurm.py``)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from typing import Any

import pytest
import yaml
from conftest import job_env

from lightning_resume.cli import emit
from lightning_resume.failure_classes import FailureClass, exit_codes

RETRY, STOP = exit_codes(True), exit_codes(False)


def slurm_conf(text: str) -> dict[str, str]:
    """``slurm.conf`` lines as SLURM reads them: ``#`` starts a comment, then ``Key=Value`` (any case)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, sep, value = line.partition("=")
            assert sep and key.isalnum() and value and " " not in value, line
            found[key.lower()] = value
    return found


def codes(value: str) -> list[int]:
    return [int(code) for code in value.split(",")]


def test_slurm_requeues_the_retryable_statuses_and_holds_the_others() -> None:
    text = emit.slurm()
    assert slurm_conf(text) == {
        "requeueexit": ",".join(map(str, RETRY)),
        "requeueexithold": ",".join(map(str, STOP)),
    }
    assert set(codes(slurm_conf(text)["requeueexit"])) == {f.exit_code for f in FailureClass if f.retryable}
    assert "#SBATCH --requeue" in text.splitlines()


def test_skypilot_recovers_the_retryable_statuses_only_and_never_137() -> None:
    recovery = yaml.safe_load(emit.skypilot())["resources"]["job_recovery"]
    assert recovery["recover_on_exit_codes"] == RETRY and 137 not in recovery["recover_on_exit_codes"]
    assert recovery["max_restarts_on_errors"] == 0  # any other failure ends the job
    assert recovery["strategy"] in ("EAGER_NEXT_REGION", "FAILOVER")  # SkyPilot's strategies
    assert set(recovery) <= {"strategy", "max_restarts_on_errors", "recover_on_exit_codes"}


def rules(policy: dict[str, Any]) -> dict[int, str]:
    """Each exit status a ``podFailurePolicy`` names, and its action (Kubernetes' own checks asserted)."""
    actions: dict[int, str] = {}
    for rule in policy["rules"]:
        assert rule["action"] in ("FailJob", "Ignore", "Count", "FailIndex")
        assert ("onExitCodes" in rule) != ("onPodConditions" in rule)
        on = rule.get("onExitCodes")
        if on is None:
            assert rule["onPodConditions"] == [{"type": "DisruptionTarget"}]
            continue
        values = on["values"]
        assert (
            on["operator"] == "In" and values == sorted(set(values)) and 0 not in values
        )  # as the API demands
        assert not set(values) & set(actions)
        actions.update(dict.fromkeys(values, rule["action"]))
    return actions


def test_kubernetes_ignores_preemption_counts_retryable_statuses_and_fails_the_others() -> None:
    job, jobset = yaml.safe_load_all(emit.kubernetes())
    expected = {code: "FailJob" for code in STOP}
    expected |= {code: "Count" for code in RETRY} | {FailureClass.PREEMPTED.exit_code: "Ignore"}
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert rules(job["spec"]["podFailurePolicy"]) == expected
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy needs it
    assert {c["name"] for c in pod["containers"]} == {"train"}
    assert jobset["kind"] == "JobSet" and jobset["apiVersion"].startswith("jobset.x-k8s.io/")
    assert jobset["spec"]["failurePolicy"]["rules"] == [
        {"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
    ]
    (workers,) = jobset["spec"]["replicatedJobs"]
    assert rules(workers["template"]["spec"]["podFailurePolicy"]) == expected
    assert workers["template"]["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_torchrun_advice_is_a_command_torchrun_accepts() -> None:
    from torch.distributed.run import get_args_parser

    text = emit.torchrun()
    (command,) = [line for line in text.splitlines() if line.startswith("torchrun ")]
    args = get_args_parser().parse_args(shlex.split(command)[1:])
    assert int(args.max_restarts) > 0 and args.training_script == "train.py"
    assert all(str(code) in text for code in RETRY + STOP)


@pytest.mark.parametrize("scheduler", sorted(emit.EMITTERS))
def test_the_command_prints_the_snippet(scheduler: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lightning_resume", "doctor", "--emit", scheduler],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == emit.EMITTERS[scheduler]()
