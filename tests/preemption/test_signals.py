from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_resume._scheduler.environment import slurm_requeue_id
from lightning_resume.preemption.signals import (
    HandlerInfo,
    describe,
    known_problems,
    signal_number,
    submitit_signal,
)


def _user_handler(signum: int, frame: object) -> None:
    pass


def test_handler_origins() -> None:
    from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

    assert describe(signal.SIG_DFL).origin == "default"
    assert describe(signal.SIG_IGN).origin == "ignored"
    assert describe(_user_handler).origin == "user"
    assert describe(_SignalConnector._sigterm_notifier_fn).origin == "lightning"
    assert "test_signals._user_handler" in describe(_user_handler).name


def test_submitit_handler_is_recognised() -> None:
    from submitit.core.job_environment import SignalHandler

    handler = SignalHandler.__new__(SignalHandler)
    assert describe(handler.bypass).origin == "submitit"


def test_signal_names() -> None:
    assert signal_number("USR1") == signal.SIGUSR1
    assert signal_number("SIGTERM") == signal.SIGTERM
    with pytest.raises(ValueError, match="Unknown signal"):
        signal_number("SIGNOPE")
    assert submitit_signal({}) == "SIGUSR2"
    assert submitit_signal({"SUBMITIT_PREEMPT_SIGNAL": "USR1"}) == "SIGUSR1"


def test_requeue_id_uses_the_array_form() -> None:
    assert slurm_requeue_id({"SLURM_JOB_ID": "10"}) == "10"
    env = {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "2"}
    assert slurm_requeue_id(env) == "10_2"
    assert slurm_requeue_id({}) is None


def test_known_bad_combinations_are_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol
    table = {"SIGTERM": HandlerInfo("SIG_DFL", "default"), "SIGUSR1": HandlerInfo("x.h", "submitit")}
    problems = known_problems(table, {"SLURM_JOB_ID": "1"})
    assert any("Lightning's SLURM auto-requeue silently installs none" in p for p in problems)
    assert any("SIGTERM is at its default action under SLURM" in p for p in problems)
    assert any("'scontrol' is not on PATH" in p for p in problems)
    assert known_problems(table, {}) == []


def test_signal_diagnostics_logs_table_and_stop_report(tmp_path: Path) -> None:
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
        "from lightning_resume import SignalDiagnostics\n"
        "SignalDiagnostics()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"SLURM_JOB_ID": "3"}
    )
    assert "signal handlers at construction: SIGTERM SIG_DFL [default]" in proc.stdout
    assert "SIGTERM is at its default action under SLURM" in proc.stderr  # a warning
