"""``RequeueCheckpoint(every_n_train_steps="auto")``: real jobs killed and restarted choose a shorter
interval as their history fills with interruptions, start from the save times they recorded, and end
exact; the spelling works from LightningCLI YAML and Hydra; bad values are refused."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import run_job, same_weights
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import RequeueCheckpoint
from lightning_resume.cli import main
from lightning_resume.last_ckpt import auto_cadence as cadence
from lightning_resume.run_dir import attempts, layout
from lightning_resume.run_dir.attempts import Cause

#: The exit status of a job preempted by SIGTERM (128 + 15), as PreemptionHandler leaves it.
EXIT = 143
AUTO = ("--every", "auto", "--no-epoch-end", "--key", "auto", "--expect-every", "3600")


def test_a_kill_shortens_the_interval_and_doctor_and_inspect_show_it(
    tmp_path: Path, baseline: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    # Attempt 1 saves at steps 10 and 20 to measure a save (the first pays one-time costs), chooses
    # from the prior, and is killed.
    assert run_job(root, out, *AUTO, "--kill-at", 22).returncode == -9
    last = run_job(root, out, *AUTO)
    assert last.returncode == 0, last.output[-3000:]
    assert same_weights(out, baseline["stateful"])
    assert last.run_dir is not None
    first, second = attempts.read(last.run_dir).attempts
    # Its step beat tells where it stopped: step 21 was the last one RunDir saw (KillAt acts first at 22).
    assert first.end is not None and first.end.cause is Cause.KILLED and first.end.step == 21
    assert first.last_ckpt_saves.count == 2 and first.cadence is not None and second.cadence is not None
    assert first.cadence["save_stall"] == pytest.approx(first.last_ckpt_saves.later.mean, abs=2e-4)
    assert first.cadence["between_source"] == "user" and first.cadence["between"] == 3600.0
    assert second.cadence["between_detail"].startswith("the history: 1 interruption(s)")
    assert second.cadence["steps"] < first.cadence["steps"]
    # One log line when it is first chosen (and when it changes materially), with the reasons.
    line = re.search(r"RequeueCheckpoint\(every_n_train_steps='auto'\) saves every \d+ steps .*", last.output)
    assert line is not None and "save stall" in line.group(0) and "1 interruption(s)" in line.group(0)
    shown_by_doctor_and_inspect(root, last.run_dir, second.cadence, capsys)


@pytest.mark.slow  # the default run has the kill case; tests/last_ckpt/test_cadence.py counts this one too
def test_a_preemption_saved_at_its_signal_still_shortens_the_interval(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    """A graceful preemption lost nothing, yet it tells the preemption rate: the restart counts it."""
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(root, out, *AUTO, "--preemption", "--signal-at", 22)
    assert first.returncode == EXIT, first.output[-3000:]
    last = run_job(root, out, *AUTO, "--preemption")
    assert last.returncode == 0, last.output[-3000:]
    assert same_weights(out, baseline["stateful"])
    assert last.run_dir is not None
    preempted, second = attempts.read(last.run_dir).attempts
    assert preempted.end is not None and preempted.end.cause is Cause.PREEMPTED
    assert not cadence.lost_work(preempted)  # its save at SIGTERM holds its last step
    assert preempted.cadence is not None and second.cadence is not None
    assert second.cadence["between_detail"].startswith("the history: 1 interruption(s)")
    assert "(0 lost work)" in second.cadence["between_detail"]
    assert second.cadence["steps"] < preempted.cadence["steps"]


def shown_by_doctor_and_inspect(
    root: Path, run_dir: Path, chosen: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``doctor`` and ``inspect`` show the interval chosen last in the run, and why."""
    said = f"every_n_train_steps='auto' saves every {chosen['steps']} steps"
    main(["doctor", "--root", str(root), "--write-test", "0", "--json"])
    (doctor,) = [f for f in json.loads(capsys.readouterr().out) if f["check"] == "checkpoint cadence"]
    assert doctor["detail"].startswith(f"{run_dir.name}: {said}"), doctor
    assert chosen["between_detail"] in doctor["detail"]
    assert main(["inspect", str(run_dir)]) == 0
    inspect = " ".join(capsys.readouterr().out.split())
    assert said in inspect and " ".join(chosen["between_detail"].split()) in inspect, inspect


@pytest.mark.slow
def test_kills_shorten_the_interval_and_a_restart_starts_from_the_recorded_save_times(
    tmp_path: Path, baseline: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    assert run_job(root, out, *AUTO, "--kill-at", 22).returncode == -9
    # Attempt 2 chooses before any save of its own, from attempt 1's recorded save times, and is killed.
    assert run_job(root, out, *AUTO, "--kill-at", 30).returncode == -9
    last = run_job(root, out, *AUTO)
    assert last.returncode == 0, last.output[-3000:]
    assert same_weights(out, baseline["stateful"])
    assert last.run_dir is not None
    first, second, third = attempts.read(last.run_dir).attempts
    assert first.cadence is not None and second.cadence is not None and third.cadence is not None
    assert second.last_ckpt_saves.count == 0  # killed at 30, before its first save
    assert second.cadence["save_stall"] == pytest.approx(first.last_ckpt_saves.later.mean, abs=2e-4)
    assert third.cadence["between_source"] == "history"
    assert third.cadence["between_detail"].startswith("the history: 2 interruption(s)")
    assert third.cadence["steps"] < second.cadence["steps"] < first.cadence["steps"]
    shown_by_doctor_and_inspect(root, last.run_dir, third.cadence, capsys)


CONFIG = """
trainer:
  max_steps: 24
  accelerator: cpu
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  limit_val_batches: 0
  callbacks:
    - class_path: lightning_resume.RunDir
      init_args:
        root: {root}
    - class_path: lightning_resume.RequeueCheckpoint
      init_args:
        every_n_train_steps: auto
        expected_interruption_every: "1:30:00"
"""


def test_auto_from_lightning_cli_yaml_and_hydra(tmp_path: Path) -> None:
    from hydra.utils import instantiate

    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(root=tmp_path / "runs"))
    cli = LightningCLI(
        BoringModel, args=["fit", "--config", str(path)], save_config_kwargs={"overwrite": True}
    )
    (callback,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, RequeueCheckpoint)]
    assert callback.every_n_train_steps == "auto"
    assert callback.expected_interruption_every == timedelta(hours=1, minutes=30)
    (run_dir,) = (tmp_path / "runs").glob(layout.RUN_GLOB)
    (attempt,) = attempts.read(run_dir).attempts
    assert attempt.cadence is not None and attempt.cadence["between"] == 5400.0  # after its second save
    assert attempt.cadence["between_detail"] == "the prior: expected_interruption_every=1.5 h"
    hydra = instantiate(
        {
            "_target_": "lightning_resume.RequeueCheckpoint",
            "every_n_train_steps": "auto",
            "expected_interruption_every": 600,
        }
    )
    assert hydra.every_n_train_steps == "auto" and hydra._cadence.auto.expected_seconds == 600.0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"every_n_train_steps": "often"}, TypeError, "'auto' or None, got 'often'"),
        ({"every_n_train_steps": 0}, ValueError, "every_n_train_steps must be >= 1"),
        ({"every_n_train_steps": True}, TypeError, "every_n_train_steps must be"),
        ({"every_n_train_steps": "auto", "expected_interruption_every": -5}, ValueError, "must be > 0"),
        (
            {"every_n_train_steps": "auto", "expected_interruption_every": "1h"},
            TypeError,
            "timedelta, a number",
        ),
    ],
)
def test_bad_values_are_refused_naming_them(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=re.escape(match)):
        RequeueCheckpoint(**kwargs)


@pytest.mark.slow
def test_every_rank_saves_at_the_same_steps_under_ddp_and_the_run_ends_exact(tmp_path: Path) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    args = ("--every", "auto", "--key", "ddp", "--expect-every", "2", "--devices", "2", "--print-saves")
    args = (*args, "--epochs", "6", "--step-sleep", "0.05")
    # Two ranks shard the data: the reference is the same DDP job, uninterrupted.
    reference = run_job(tmp_path / "ref", tmp_path / "ref.pt", *args, timeout=300)
    assert reference.returncode == 0, reference.output[-3000:]
    assert run_job(root, out, *args, "--kill-at", 17, timeout=300).returncode == -9
    last = run_job(root, out, *args, timeout=300)
    assert last.returncode == 0, last.output[-3000:]
    assert same_weights(out, tmp_path / "ref.pt")
    saves = re.findall(r"SAVED rank=(\d) step=(\d+)", last.output)
    by_rank = {rank: [step for r, step in saves if r == rank] for rank in ("0", "1")}
    assert by_rank["0"] == by_rank["1"] and len(by_rank["0"]) >= 3, saves


def test_a_killed_attempt_records_every_save_it_made(tmp_path: Path) -> None:
    """A restart after a SIGKILL prices a save from the killed attempt's saves after its first: the
    record must hold them all, not only the first (it was written at the first save alone)."""
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    assert run_job(root, out, "--every", "2", "--no-epoch-end", "--kill-at", 9).returncode == -9
    (run_dir,) = layout.run_dirs(root)
    (first,) = attempts.read(run_dir).attempts
    saves = first.last_ckpt_saves
    assert saves.count == 4 and saves.first_stall is not None  # steps 2, 4, 6 and 8
    assert saves.later.count == 3
    assert saves.later.seconds == pytest.approx(saves.stall_seconds - saves.first_stall)
