"""LocalLoggerResume: Lightning's default logger and explicit TensorBoard/CSV loggers continue one version
dir through a SIGKILL and a SIGTERM, every step logged once, read back with TensorBoard's own event
reader and from ``metrics.csv``."""

from __future__ import annotations

import csv
import random
import warnings
from pathlib import Path

import pytest
from _tracker_data import only_run_dir, read_sidecar_file, run_tracker_job

from lightning_resume._resume.quiet_lightning import QuietLightning
from lightning_resume.trackers import _local_logs

pytest.importorskip("tensorboard")

STEPS, EVERY = 20, 3


def interrupt_twice(workdir: Path, tracker: str) -> str:
    """SIGKILL at a random step, SIGTERM at a later random step, then an attempt that finishes.

    The SIGKILL lands between two checkpoints, after a step the restart logs again, so the killed
    attempt leaves rows past the resumed step. Returns the steps chosen, for failure messages.
    """
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    kill = rng.choice([s for s in range(4, 11) if (s - 1) % EVERY != 0])
    term = rng.randint(kill + 2, STEPS - 3)
    chosen = f"seed {seed}: SIGKILL at {kill}, SIGTERM at {term}"
    for how, step in (("kill", kill), ("term", term), (None, None)):
        args = ["--steps", STEPS, "--every", EVERY, "--project", "local"]
        args += ["--kill-at", step, "--signal", how] if how else []
        result = run_tracker_job(workdir, tracker, *args, LIGHTNING_RESUME_KEY="logs")
        assert result.returncode == (-9 if how == "kill" else 0), f"{chosen}\n{result.output[-3000:]}"
        assert result.finished == (how is None), f"{chosen}\n{result.output[-3000:]}"
    return chosen


def tensorboard_steps(log_dir: Path) -> tuple[list[tuple[int, float]], list[int]]:
    """``(step, value)`` of ``echo`` as TensorBoard shows it, and the raw steps in the event files."""
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    shown = [(event.step, event.value) for event in accumulator.Scalars("echo")]
    raw = []
    for file in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in event_file_loader.EventFileLoader(str(file)).Load():
            if any(value.tag == "echo" for value in event.summary.value):
                raw.append(event.step)
    return shown, raw


def csv_steps(log_dir: Path) -> list[tuple[int, float]]:
    with open(log_dir / "metrics.csv", newline="") as f:
        return [(int(row["step"]), float(row["echo"])) for row in csv.DictReader(f) if row.get("echo")]


def every_step_once(pairs: list[tuple[int, float]]) -> bool:
    return pairs == [(step, float(step)) for step in range(STEPS)]


def test_default_tensorboard_logger_continues_one_version(tmp_path: Path) -> None:
    chosen = interrupt_twice(tmp_path, "default")
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0"], chosen
    version = tmp_path / "lightning_logs" / "version_0"
    shown, raw = tensorboard_steps(version)
    assert every_step_once(shown), f"{chosen}: {shown}"
    assert len(raw) > STEPS, f"{chosen}: the killed attempt's later events are in the files ({raw})"
    run_dir = only_run_dir(tmp_path)
    assert (run_dir / "logs" / "tensorboard").resolve() == version.resolve()
    assert read_sidecar_file(run_dir, "tensorboard")["identity"]["version"] == 0


def test_default_csv_logger_continues_one_version(tmp_path: Path) -> None:
    chosen = interrupt_twice(tmp_path, "default-csv")
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0"], chosen
    version = tmp_path / "lightning_logs" / "version_0"
    assert every_step_once(csv_steps(version)), f"{chosen}: {csv_steps(version)}"
    assert not (version / _local_logs.KEPT).exists()
    assert (only_run_dir(tmp_path) / "logs" / "csv").resolve() == version.resolve()


@pytest.mark.slow
def test_explicit_tensorboard_and_csv_loggers_with_fixed_versions_continue(tmp_path: Path) -> None:
    chosen = interrupt_twice(tmp_path, "local")
    logs = tmp_path / "trackers" / "lightning_logs"
    assert sorted(p.name for p in logs.iterdir()) == ["fixed", "version_0"], chosen
    shown, _ = tensorboard_steps(logs / "fixed")
    assert every_step_once(shown), f"{chosen}: {shown}"
    # CSVLogger(version=0) deletes metrics.csv when its writer starts in a non-empty dir: the rows of the
    # interrupted attempts survive only because they were set aside before fit.
    assert every_step_once(csv_steps(logs / "version_0")), f"{chosen}: {csv_steps(logs / 'version_0')}"


# -- the file functions -----------------------------------------------------------------------------


def test_merge_keeps_rows_before_the_resumed_step_and_drops_a_torn_row(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("echo,epoch,loss,step\n0,0,1.5,0\n1,0,1.4,1\n2,0,1.3,2\n3,0,1.")
    assert _local_logs.set_aside_metrics(tmp_path)
    assert not (tmp_path / "metrics.csv").exists()
    (tmp_path / "metrics.csv").write_text("epoch,step,val\n0,2,9\n")  # this attempt's first row
    header = _local_logs.merge_kept_rows(tmp_path, 2)
    assert header == ["echo", "epoch", "loss", "step", "val"]
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(row["step"], row["echo"], row["val"]) for row in rows] == [
        ("0", "0", ""),
        ("1", "1", ""),
        ("2", "", "9"),
    ]
    assert not (tmp_path / _local_logs.KEPT).exists()


def test_a_kept_file_of_a_restart_that_died_before_merging_stays(tmp_path: Path) -> None:
    (tmp_path / _local_logs.KEPT).write_text("step\n0\n")
    assert _local_logs.set_aside_metrics(tmp_path)
    assert (tmp_path / _local_logs.KEPT).read_text() == "step\n0\n"
    _local_logs.put_back_metrics(tmp_path)
    assert (tmp_path / "metrics.csv").read_text() == "step\n0\n"


def test_quiet_deletion_warning_matches_only_its_dir_until_removed(tmp_path: Path) -> None:
    owner = type("Owner", (), {})()
    message = "Experiment logs directory lightning_logs/version_{} exists and is not empty."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet = QuietLightning(owner, _local_logs.deletion_warning(tmp_path / "lightning_logs" / "version_0"))
        warnings.warn(message.format(0), stacklevel=1)
        warnings.warn(message.format(1), stacklevel=1)
        quiet.remove()
        warnings.warn(message.format(0), stacklevel=1)
    assert [str(w.message) for w in caught] == [message.format(1), message.format(0)]
