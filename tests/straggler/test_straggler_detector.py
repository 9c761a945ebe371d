"""``StragglerDetector`` in real DDP jobs of 4 CPU ranks (gloo, Lightning's launcher): a slow backward and
a slow data loader named with the right part within 3 windows, a rank that slows down midway too, once
each and from global rank 0 only; no rank named over 1,000 clean steps; a killed and resumed run names
no rank from stale data and does not name a rank again. The jobs are ``tests/jobs/straggler_job.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import job_env, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import StragglerDetector
from lightning_resume.cli import main
from lightning_resume.run_dir import attempts
from lightning_resume.straggler.straggler_detector import WARMUP

WARNING = "StragglerDetector: rank "


def run(
    tmp_path: Path, name: str, *args: str | int, **env: str | int
) -> tuple[int, str, list[dict[str, Any]]]:
    """Run the job once: its exit status, its output and the stragglers it named (``on_straggler``)."""
    out = tmp_path / f"{name}.jsonl"
    cmd = [sys.executable, "-m", "jobs.straggler_job", "--out", str(out), *map(str, args)]
    proc = subprocess.run(
        cmd, env=job_env(**env), capture_output=True, text=True, timeout=900, start_new_session=True
    )
    named = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, named


def windows_to(step: int, change: int, window: int, resumed_at: int = 0) -> int:
    """How many windows closed after step ``change``, up to the one that ended at ``step`` (a fit's
    windows close every ``window`` steps after its first ``WARMUP``)."""
    first = resumed_at + WARMUP + window
    return sum(1 for end in range(first, step + 1, window) if end > change)


@pytest.mark.long
def test_a_slow_backward_a_slow_loader_and_a_midway_slowdown_are_named_with_their_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    window = 10
    status, output, named = run(
        tmp_path,
        "named",
        *("--steps", 63, "--window", window, "--root", tmp_path / "runs"),
        *("--slow-backward", "1:0.2", "--slow-data", "2:0.15", "--slow-backward", "3:0.2:38"),
    )
    assert status == 0, output
    assert [(s["rank"], s["part"]) for s in named] == [(1, "compute"), (2, "data"), (3, "compute")], named
    one, two, three = named
    latencies = [windows_to(one["step"], 0, window), windows_to(two["step"], 0, window)]
    latencies.append(windows_to(three["step"], 38, window))
    assert all(1 <= n <= 3 for n in latencies), latencies
    assert one["seconds"] > 0.15 and two["seconds"] > 0.1 and one["waited"] < one["others_waited"]
    # One warning per slow rank, from global rank 0 only (the four ranks share this output).
    warnings = [line for line in output.splitlines() if WARNING in line]
    assert len(warnings) == 3, warnings
    assert "rank 2 on node" in warnings[1] and "data wait" in warnings[1]
    # The record in attempts.json, and the report's section.
    (run_dir,) = (tmp_path / "runs").glob("[0-9]*/[0-9]*/*")
    (attempt,) = attempts.read(run_dir).attempts
    assert attempt.stragglers is not None
    assert [s["rank"] for s in attempt.stragglers["named"]] == [1, 2, 3]
    assert [r["rank"] for r in attempt.stragglers["ranks"]] == [0, 1, 2, 3]
    assert attempt.stragglers["windows"] == (63 - WARMUP) // window
    capsys.readouterr()
    plot = tmp_path / "report.png"
    assert main(["report", str(run_dir), "--plot", str(plot)]) == 0
    report = capsys.readouterr().out
    assert "attempt 1: straggler rank 2 on node" in report and "data wait" in report
    assert "ranks of attempt 1" in report
    assert plot.read_bytes()[:4] == b"\x89PNG"
    print(f"detection latency in windows (rank 1 backward, rank 2 data, rank 3 midway): {latencies}")


@pytest.mark.slow
def test_a_thousand_clean_steps_name_no_rank_with_the_default_settings(tmp_path: Path) -> None:
    windows = tmp_path / "windows.jsonl"
    status, output, named = run(
        tmp_path,
        "clean",
        *("--steps", 1000 + WARMUP, "--windows-out", windows, "--root", tmp_path / "runs"),
        *("--every", 100, "--validate-every", 250),  # rank 0's saves and validation: no data wait
    )
    assert status == 0, output
    assert named == [] and WARNING not in output
    summary = json.loads(windows.read_text().splitlines()[-1])
    assert summary["windows"] == 1000 // StragglerDetector().window


@pytest.mark.slow  # two launches of 4 ranks; the checkpoint's part runs in one process below
def test_a_resumed_run_names_no_rank_from_stale_data_nor_a_rank_named_before(tmp_path: Path) -> None:
    # Rank 2 loads slowly throughout: named in the first attempt (step 23), before the checkpoint at
    # step 44. Rank 1's backward is slow from step 33 to 57: slow in the window that ends at step 43,
    # before the checkpoint, and in the first window of the restart, after it: two windows in a row
    # across a kill, which is no evidence.
    common = ("--window", 10, "--root", tmp_path / "runs", "--every", 22)
    slow = ("--slow-data", "2:0.15", "--slow-backward", "1:0.2:33:57")
    status, output, named = run(
        tmp_path, "first", *common, *slow, "--steps", 70, "--kill-at", 46, SLURM_JOB_ID=7
    )
    assert status == -9, output
    assert [(s["rank"], s["part"], s["step"]) for s in named] == [(2, "data", 23)]
    windows = tmp_path / "windows.jsonl"
    status, output, named = run(
        tmp_path,
        "second",
        *common,
        *slow,
        *("--steps", 70, "--windows-out", windows),
        SLURM_JOB_ID=7,
        SLURM_RESTART_COUNT=1,
    )
    assert status == 0, output
    assert named == [] and WARNING not in output, output
    assert "DONE step=70 named=1" in output  # rank 2, from the checkpoint
    first_window = json.loads(windows.read_text().splitlines()[0])
    assert first_window["step"] == 44 + WARMUP + 10
    assert first_window["ranks"][1]["compute"] > 0.15  # rank 1 was slow in it: one window, not named
    (run_dir,) = (tmp_path / "runs").glob("[0-9]*/[0-9]*/*")
    first, second = attempts.read(run_dir).attempts
    assert first.stragglers is not None and second.stragglers is not None
    assert [s["rank"] for s in first.stragglers["named"]] == [2] and second.stragglers["named"] == []


# -- one process ----------------------------------------------------------------------------------


def test_a_single_process_measures_nothing(tmp_path: Path) -> None:
    detector = StragglerDetector()
    tiny_trainer(detector, tmp_path=tmp_path, max_steps=8, limit_train_batches=8).fit(BoringModel())
    assert detector.summary() == {"window": 100, "windows": 0, "ranks": [], "named": []}
    assert detector.stragglers == []


def test_its_state_keeps_the_ranks_named_and_reads_a_checkpoint_without_it() -> None:
    detector = StragglerDetector()
    named = {"rank": 3, "host": "gpu-017", "part": "data", "seconds": 0.15, "median": 0.01}
    detector.load_state_dict({"named": [{**named, "windows": 2, "step": 40}]})
    assert [(s.rank, s.host, s.part) for s in detector.stragglers] == [(3, "gpu-017", "data")]
    assert StragglerDetector().state_dict() == {"named": []}
    again = StragglerDetector()
    again.load_state_dict(detector.state_dict())
    assert again.stragglers == detector.stragglers
    again.load_state_dict({})  # a checkpoint from before it was added
    assert again.stragglers == []


def test_the_ranks_named_travel_in_the_checkpoint(tmp_path: Path) -> None:
    before = StragglerDetector(window=5)
    before.load_state_dict(
        {
            "named": [
                {
                    "rank": 1,
                    "host": "n1",
                    "part": "compute",
                    "seconds": 0.3,
                    "median": 0.1,
                    "windows": 2,
                    "step": 12,
                }
            ]
        }
    )
    trainer = tiny_trainer(before, tmp_path=tmp_path, max_steps=2)
    trainer.fit(BoringModel())
    trainer.save_checkpoint(tmp_path / "saved.ckpt")
    after = StragglerDetector(window=5)
    resumed = tiny_trainer(after, tmp_path=tmp_path, max_steps=4)
    resumed.fit(BoringModel(), ckpt_path=tmp_path / "saved.ckpt")
    assert after.stragglers == before.stragglers and after.stragglers[0].host == "n1"
    assert after.summary()["named"] == []  # none named in this fit


@pytest.mark.parametrize(
    ("arguments", "error", "says"),
    [
        ({"window": 0}, ValueError, "window must be >= 1"),
        ({"window": 2.5}, TypeError, "window must be a whole number"),
        ({"threshold": -0.1}, ValueError, "threshold must be >= 0"),
        ({"floor_ms": "50"}, TypeError, "floor_ms must be a number"),
        ({"patience": True}, TypeError, "patience must be a whole number"),
        ({"on_straggler": "exclude"}, TypeError, "on_straggler must be a function"),
    ],
)
def test_bad_arguments_are_refused_at_construction(
    arguments: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        StragglerDetector(**arguments)
