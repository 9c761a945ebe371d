"""``lightning-resume doctor``'s grace window: the real console script against a real checkpoint."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import job_env, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import RequeueCheckpoint, RunDir
from lightning_resume.cli import doctor

SCRIPT = str(Path(sys.executable).parent / "lightning-resume")


class _WideModel(BoringModel):
    """A BoringModel with a few MiB of weights, so that a save takes measurable time."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = torch.nn.Linear(1024, 1024)  # 4 MiB of float32 weights


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs root holding one run with a ``last.ckpt`` written by a real fit."""
    folder = tmp_path_factory.mktemp("grace")
    trainer = tiny_trainer(
        RunDir(root=folder / "runs", key="grace"), RequeueCheckpoint(), tmp_path=folder, max_steps=2
    )
    trainer.fit(_WideModel())
    (ckpt,) = (folder / "runs").glob("[0-9]*/[0-9]*/*/checkpoints/last.ckpt")
    assert ckpt.stat().st_size > 4 << 20
    return folder / "runs"


def grace(*args: str | Path, **env: str) -> tuple[int, list[dict[str, str]]]:
    """Run ``doctor --json`` and return its exit status and the grace window findings."""
    out = subprocess.run(
        [SCRIPT, "doctor", "--json", *map(str, args)],
        env=job_env(WANDB_MODE="offline", SWANLAB_MODE="offline", **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, [f for f in json.loads(out.stdout) if f["check"] == "grace window"]


def test_a_window_too_short_for_the_newest_checkpoint_warns_with_numbers(root: Path) -> None:
    status, (finding,) = grace("--root", root, "--write-test", "8", LIGHTNING_RESUME_GRACE_SECONDS="0.001")
    assert status == 0  # a warning, not an error
    assert finding["level"] == "warn", finding
    detail = finding["detail"]
    assert detail.startswith("explicit SIGTERM: 0.001 s ($LIGHTNING_RESUME_GRACE_SECONDS); last.ckpt ")
    assert re.search(r"last\.ckpt [\d.]+ MiB at [\d,.]+ MiB/s durable: a save needs ~[\d.e-]+ s", detail)
    assert detail.endswith("more than 80% of the window")
    assert "give the job at least 1 s" in finding["hint"]
    assert "RequeueCheckpoint(every_n_minutes=...)" in finding["hint"]


def test_torchrun_gives_its_shutdown_timeout(tmp_path: Path) -> None:
    _, (finding,) = grace("--root", tmp_path, "--write-test", "8", TORCHELASTIC_RUN_ID="r")
    assert finding["level"] == "ok"
    assert finding["detail"].startswith("torchrun SIGTERM: 30 s (torchrun's default shutdown timeout); ")
    assert "no checkpoint under the root yet, so no estimate" in finding["detail"]
    assert re.search(r"a checkpoint of up to [\d,.]+ [MG]iB fits", finding["detail"])


def test_a_bad_value_is_an_error_naming_the_variable(tmp_path: Path) -> None:
    status, (finding,) = grace(
        "--root", tmp_path, "--write-test", "0", LIGHTNING_RESUME_GRACE_SECONDS="two minutes"
    )
    assert status == 1
    assert finding["level"] == "error"
    assert finding["detail"].startswith("LIGHTNING_RESUME_GRACE_SECONDS='two minutes' is not a number")


# The same checks in this process (a doctor subprocess spends seconds importing Lightning).


def checks(root: Path, environ: dict[str, str], write_mib: int = 8) -> list[doctor.Finding]:
    return [f for f in doctor.run_checks(root, environ, write_mib << 20) if f.check == "grace window"]


def test_a_long_enough_window_is_ok(root: Path) -> None:
    (finding,) = checks(root, {"LIGHTNING_RESUME_GRACE_SECONDS": "3600"})
    assert finding.level is doctor.Level.OK and finding.hint == ""
    assert "explicit SIGTERM: 3,600 s" in finding.detail and "a save needs ~" in finding.detail


def test_without_a_write_test_there_is_no_estimate(root: Path) -> None:
    (finding,) = checks(root, {"LIGHTNING_RESUME_GRACE_SECONDS": "1"}, write_mib=0)
    assert finding.level is doctor.Level.OK
    assert "last.ckpt" in finding.detail and "write speed not measured: no estimate" in finding.detail


def test_torchrun_timeout_from_its_variables(tmp_path: Path) -> None:
    env = {"TORCHELASTIC_RUN_ID": "r", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60", "PET_SHUTDOWN_TIMEOUT": "90"}
    (finding,) = checks(tmp_path, env, write_mib=0)
    assert finding.detail.startswith("torchrun SIGTERM: 90 s ($PET_SHUTDOWN_TIMEOUT); ")
    (bad,) = checks(tmp_path, {"TORCHELASTIC_RUN_ID": "r", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "30s"}, 0)
    assert bad.level is doctor.Level.ERROR and bad.detail.startswith("TORCH_ELASTIC_SHUTDOWN_TIMEOUT='30s'")


def test_kubernetes_assumes_the_default_and_says_so(tmp_path: Path) -> None:
    (finding,) = checks(tmp_path, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, write_mib=0)
    assert finding.detail.startswith("kubernetes SIGTERM: 30 s (assumed: terminationGracePeriodSeconds")


def test_no_scheduler_says_how_to_declare_a_window(tmp_path: Path) -> None:
    (finding,) = checks(tmp_path, {}, write_mib=0)
    assert finding.level is doctor.Level.OK and finding.detail.startswith("no scheduler window found")
    assert "LIGHTNING_RESUME_GRACE_SECONDS=N" in finding.hint


def test_in_a_slurm_job_without_scontrol_kill_wait_is_unknown(tmp_path: Path) -> None:
    findings = checks(tmp_path, {"SLURM_JOB_ID": "1", "PATH": str(tmp_path)}, write_mib=0)
    assert [(f.level, f.detail) for f in findings] == [
        (doctor.Level.WARN, "slurm: `scontrol show config` gave nothing, so KillWait is unknown")
    ]
