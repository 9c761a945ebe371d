"""The grace-window readers and the fit decision, on text captured from Slurm 22.05.8 and torch 2.13."""

from __future__ import annotations

import pytest

from lightning_resume.preemption.grace import (
    FIT_SHARE,
    SAVE_OVERHEAD,
    Kind,
    SlurmSignal,
    Window,
    advice,
    batch_script_signal,
    fits,
    kill_wait,
    largest_fitting_bytes,
    number_text,
    parse_signal_spec,
    partition_grace_time,
    preemption_enabled,
    save_seconds,
    slurm_signal,
    submit_line_signal,
    torchrun_forwards,
    torchrun_kills,
    windows,
)

# `scontrol show config` (an excerpt: the lines around the ones read, as printed).
SHOW_CONFIG = """\
Configuration data as of 2026-11-24T03:33:26
JobRequeue              = 1
JobSubmitPlugins        = (null)
KillOnBadExit           = 0
KillWait                = 5 sec
LaunchParameters        = (null)
PowerPlugin             =\x20
PreemptMode             = REQUEUE
PreemptType             = preempt/partition_prio
PreemptExemptTime       = 00:00:00
SLURM_VERSION           = 22.05.8
"""

# `scontrol show partition low`: preempted (PreemptMode=REQUEUE) with a grace time.
PARTITION_LOW = """\
PartitionName=low
   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL
   AllocNodes=ALL Default=YES QoS=N/A
   DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=10 Hidden=NO
   MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED
   Nodes=vm
   PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO
   OverTimeLimit=NONE PreemptMode=REQUEUE
   State=UP TotalCPUs=2 TotalNodes=1 SelectTypeParameters=NONE
"""

# `scontrol show partition high`: never preempted.
PARTITION_HIGH = PARTITION_LOW.replace("GraceTime=10", "GraceTime=0").replace(
    "PreemptMode=REQUEUE", "PreemptMode=OFF"
)

# `sacct -X -j ID -o SubmitLine%1000 -P -n`: printed without the shell's quotes.
SUBMIT_LINE = "sbatch --parsable --time=2 --signal=USR1@45 --wrap=python -c 'print(1)\n"
SUBMIT_LINE_PLAIN = "sbatch --parsable --time=2 /tmp/g13/job.sh\n"

# `scontrol write batch_script ID -`
BATCH_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=grace-probe
#SBATCH --signal=B:USR1@90
#SBATCH --output=/tmp/g13/out-%j.txt
echo "part=$SLURM_JOB_PARTITION"
#SBATCH --signal=USR2@5
srun python train.py
"""

IN_JOB = {"SLURM_JOB_ID": "52", "SLURM_JOB_PARTITION": "low"}


def test_kill_wait_and_preemption_come_from_scontrol_show_config() -> None:
    assert kill_wait(SHOW_CONFIG) == 5
    assert kill_wait(SHOW_CONFIG.replace("5 sec", "30 sec")) == 30
    assert kill_wait("SLURM_VERSION = 22.05.8\n") is None
    assert preemption_enabled(SHOW_CONFIG)
    assert not preemption_enabled(SHOW_CONFIG.replace("preempt/partition_prio", "preempt/none"))


def test_grace_time_counts_only_for_a_partition_that_is_preempted() -> None:
    assert partition_grace_time(PARTITION_LOW) == 10
    assert partition_grace_time(PARTITION_HIGH) is None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("B:USR1@90", SlurmSignal("SIGUSR1", 90, batch_only=True)),
        ("USR1", SlurmSignal("SIGUSR1", 60, batch_only=False)),  # sbatch's default lead
        ("SIGUSR2@120", SlurmSignal("SIGUSR2", 120, batch_only=False)),
        ("10@30", SlurmSignal("SIGUSR1", 30, batch_only=False)),  # by number (Linux)
        ("R:TERM@45", SlurmSignal("SIGTERM", 45, batch_only=False)),
    ],
)
def test_signal_specs_in_every_form_sbatch_takes(spec: str, expected: SlurmSignal) -> None:
    assert parse_signal_spec(spec) == expected


@pytest.mark.parametrize("spec", ["", "USR1@soon", "X:USR1", "NOPE@10"])
def test_a_bad_signal_spec_is_a_value_error(spec: str) -> None:
    with pytest.raises(ValueError, match="signal"):
        parse_signal_spec(spec)


def test_the_signal_is_read_from_the_submit_line_and_the_batch_script() -> None:
    assert submit_line_signal(SUBMIT_LINE) == SlurmSignal("SIGUSR1", 45, batch_only=False)
    assert submit_line_signal("sbatch --signal B:USR2@30 job.sh") == SlurmSignal("SIGUSR2", 30, True)
    assert submit_line_signal(SUBMIT_LINE_PLAIN) is None
    assert submit_line_signal("sbatch --signal=USR1@30 --signal=USR2@40 job.sh") == SlurmSignal(
        "SIGUSR2", 40, False
    )
    # Only the #SBATCH lines before the first command count, as for sbatch.
    assert batch_script_signal(BATCH_SCRIPT) == SlurmSignal("SIGUSR1", 90, batch_only=True)
    assert batch_script_signal(BATCH_SCRIPT.replace("#SBATCH --signal=B:USR1@90\n", "")) is None
    later = BATCH_SCRIPT.replace("#SBATCH --output", "#SBATCH --signal=USR2@30\n#SBATCH --output")
    assert batch_script_signal(later) == SlurmSignal("SIGUSR2", 30, batch_only=False)


def test_the_command_line_wins_over_sbatch_signal_over_the_script() -> None:
    assert slurm_signal(IN_JOB, SUBMIT_LINE, BATCH_SCRIPT).lead == 45  # type: ignore[union-attr]
    env = {**IN_JOB, "SBATCH_SIGNAL": "USR2@200"}
    assert slurm_signal(env, SUBMIT_LINE_PLAIN, BATCH_SCRIPT) == SlurmSignal("SIGUSR2", 200, False)
    assert slurm_signal(IN_JOB, SUBMIT_LINE_PLAIN, BATCH_SCRIPT).lead == 90  # type: ignore[union-attr]
    assert slurm_signal(IN_JOB, None, None) is None
    with pytest.raises(ValueError, match="SBATCH_SIGNAL='USR1@later'"):
        slurm_signal({**IN_JOB, "SBATCH_SIGNAL": "USR1@later"})


def test_a_slurm_job_has_the_kill_wait_the_preemption_and_the_signal_windows() -> None:
    found = windows(IN_JOB, SHOW_CONFIG, PARTITION_LOW, SUBMIT_LINE_PLAIN, BATCH_SCRIPT)
    assert [(w.label, w.seconds) for w in found] == [
        ("slurm SIGTERM", 5),
        ("slurm preemption", 15),
        ("slurm SIGUSR1", 95),
    ]
    assert found[1].origin == "partition low GraceTime 10 s + KillWait"
    assert found[2].origin == "--signal lead 90 s + KillWait, to the batch shell only"
    assert [w.label for w in windows(IN_JOB, SHOW_CONFIG, PARTITION_HIGH)] == ["slurm SIGTERM"]


def test_without_scontrol_the_signal_lead_alone_is_the_window() -> None:
    (only,) = windows(IN_JOB, None, None, None, BATCH_SCRIPT)
    assert (only.seconds, only.origin) == (
        90,
        "--signal lead 90 s, KillWait unknown, to the batch shell only",
    )


def test_scontrol_text_outside_a_slurm_job_is_ignored() -> None:
    assert windows({}, SHOW_CONFIG, PARTITION_LOW, SUBMIT_LINE) == []


def test_torchrun_window_from_its_variables_or_its_default() -> None:
    (default,) = windows({"TORCHELASTIC_RUN_ID": "r"})
    assert (default.kind, default.seconds) == (Kind.TORCHRUN, 30)
    env = {"TORCHELASTIC_RUN_ID": "r", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}
    assert windows(env)[0].seconds == 90
    # PET_SHUTDOWN_TIMEOUT is --shutdown-timeout's environment form: torchrun prefers it.
    assert windows({**env, "PET_SHUTDOWN_TIMEOUT": "120"})[0].origin == "$PET_SHUTDOWN_TIMEOUT"
    with pytest.raises(ValueError, match="TORCH_ELASTIC_SHUTDOWN_TIMEOUT='1m'"):
        windows({"TORCHELASTIC_RUN_ID": "r", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "1m"})


def test_kubernetes_window_is_assumed_and_says_so() -> None:
    (pod,) = windows({"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert (pod.label, pod.seconds) == ("kubernetes SIGTERM", 30)
    assert "assumed" in pod.origin and "LIGHTNING_RESUME_GRACE_SECONDS" in pod.origin


def test_the_explicit_window_wins_over_every_scheduler() -> None:
    env = {**IN_JOB, "TORCHELASTIC_RUN_ID": "r", "KUBERNETES_SERVICE_HOST": "h"}
    env["LIGHTNING_RESUME_GRACE_SECONDS"] = "240"
    assert windows(env, SHOW_CONFIG, PARTITION_LOW, SUBMIT_LINE) == [
        Window(Kind.EXPLICIT, "SIGTERM", 240, "$LIGHTNING_RESUME_GRACE_SECONDS")
    ]


@pytest.mark.parametrize("value", ["two minutes", "-5", "0", "nan", "inf"])
def test_a_bad_explicit_window_is_a_value_error_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=f"LIGHTNING_RESUME_GRACE_SECONDS={value!r}"):
        windows({"LIGHTNING_RESUME_GRACE_SECONDS": value})


def test_save_time_is_the_write_time_times_the_overhead() -> None:
    assert SAVE_OVERHEAD == 1.5
    assert save_seconds(100 << 20, 106 << 20) == pytest.approx(1.415, abs=1e-3)
    assert save_seconds(100, 100, overhead=1) == 1
    with pytest.raises(ValueError, match="bytes_per_second"):
        save_seconds(1, 0)


def test_a_save_fits_in_four_fifths_of_the_window() -> None:
    assert FIT_SHARE == 0.8
    assert fits(4, 5) and not fits(4.01, 5)
    largest = largest_fitting_bytes(95, 100 << 20)
    assert fits(save_seconds(int(largest), 100 << 20), 95)
    assert not fits(save_seconds(int(largest * 1.01), 100 << 20), 95)


def test_advice_names_the_setting_and_the_numbers() -> None:
    need = 40.0  # a window of 50 s would do
    signal_window = Window(Kind.SLURM_SIGNAL, "SIGUSR1", 35, "--signal lead 30 s + KillWait", fixed=5)
    assert "raise the --signal lead to at least 45 s" in advice(signal_window, need)
    assert "#SBATCH --signal=USR1@60" in advice(Window(Kind.SLURM_KILL_WAIT, "SIGTERM", 5, "KillWait"), need)
    assert "--shutdown-timeout 50" in advice(Window(Kind.TORCHRUN, "SIGTERM", 30, ""), need)
    assert "terminationGracePeriodSeconds: 50" in advice(Window(Kind.KUBERNETES, "SIGTERM", 30, ""), need)
    assert "RequeueCheckpoint(every_n_minutes=...)" in advice(Window(Kind.EXPLICIT, "SIGTERM", 1, ""), need)


def test_torchrun_is_killed_by_a_slurm_signal_it_does_not_forward() -> None:
    usr1 = SlurmSignal("SIGUSR1", 90, batch_only=False)
    assert torchrun_forwards({}) == ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    assert torchrun_kills({"TORCHELASTIC_RUN_ID": "r"}, usr1)
    forwarding = {"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGUSR1"}
    assert not torchrun_kills(forwarding, usr1)
    assert not torchrun_kills({}, usr1)  # not under torchrun
    assert not torchrun_kills({"TORCHELASTIC_RUN_ID": "r"}, SlurmSignal("SIGUSR1", 90, batch_only=True))


def test_numbers_are_shown_without_false_precision() -> None:
    assert [number_text(x) for x in (95.0, 1.4142, 0.001, 4416.2, 12.6)] == [
        "95",
        "1.4",
        "0.001",
        "4,416",
        "13",
    ]
