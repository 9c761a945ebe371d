"""LocalLoggerResume: Lightning's default logger and explicit TensorBoard/CSV loggers continue one version
dir through SIGKILLs and SIGTERMs, cut exactly at the checkpoint the restart loads: what TensorBoard's
``EventAccumulator`` shows (scalars, figures, histograms, text, hparams), every ``(tag, step)`` in the
event files and the rows of ``metrics.csv`` equal an uninterrupted run's."""

from __future__ import annotations

import csv
import logging
import math
import random
import struct
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import yaml
from _tracker_data import (
    csv_rows,
    only_run_dir,
    read_sidecar_file,
    run_tracker_job,
    tensorboard_events,
    tensorboard_view,
)
from conftest import built_once, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lightning_resume import LocalLoggerResume, RequeueCheckpoint, RunDir
from lightning_resume._compat.lightning import QuietLightning, log_dir_exists
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


def echo_steps(log_dir: Path) -> list[tuple[int, float]]:
    """``(step, value)`` of ``echo`` as TensorBoard shows it."""
    return [(step, value) for step, value in tensorboard_view(log_dir)["scalars/echo"]]


def csv_steps(log_dir: Path) -> list[tuple[int, float]]:
    return [
        (int(row["step"]), float(row["echo"])) for row in csv_rows(log_dir / "metrics.csv") if "echo" in row
    ]


def every_step_once(pairs: list[tuple[int, float]]) -> bool:
    return pairs == [(step, float(step)) for step in range(STEPS)]


@pytest.mark.slow
def test_default_tensorboard_logger_continues_one_version(tmp_path: Path) -> None:
    chosen = interrupt_twice(tmp_path, "default")
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0"], chosen
    version = tmp_path / "lightning_logs" / "version_0"
    assert every_step_once(echo_steps(version)), f"{chosen}: {echo_steps(version)}"
    # Cut, not hidden: each step's event is in the files once.
    events = tensorboard_events(version)
    assert [events[("echo", step)] for step in range(STEPS)] == [1] * STEPS, f"{chosen}: {events}"
    run_dir = only_run_dir(tmp_path)
    assert (run_dir / "logs" / "tensorboard").resolve() == version.resolve()
    assert read_sidecar_file(run_dir, "tensorboard")["identity"]["version"] == 0


@pytest.mark.slow  # the TensorBoard case (the default logger) stays in the default run
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
    assert every_step_once(echo_steps(logs / "fixed")), f"{chosen}: {echo_steps(logs / 'fixed')}"
    # CSVLogger(version=0) deletes metrics.csv when its writer starts in a non-empty dir: the rows of the
    # interrupted attempts survive only because they were set aside before fit.
    assert every_step_once(csv_steps(logs / "version_0")), f"{chosen}: {csv_steps(logs / 'version_0')}"


# -- cut exactly at the checkpoint: compared with an uninterrupted run ---------------------------------

#: 12 steps in 3 epochs of 4, a save every 2 steps and at each epoch's end, an epoch-end validation that
#: logs val_loss and, to TensorBoard, a figure, a histogram and a text at the epoch's last step, and
#: LearningRateMonitor logging an epoch-interval StepLR's rate as each epoch starts.
LOGGED = ("--steps", 12, "--every", 2, "--epochs", 3, "--validate", "--project", "local")
SETUPS = {
    # TensorBoardLogger(version="fixed") and CSVLogger(version=0), LocalLoggerResume listed (the one
    # RequeueCheckpoint would put in stands down), LearningRateMonitor listed before it.
    "local": ("local", "--lr-monitor-first"),
    # The default logger and the quickstart's RunDir, RequeueCheckpoint and PreemptionHandler:
    # RequeueCheckpoint puts a LocalLoggerResume in.
    "default": ("default", "--no-resume", "--lr-monitor", "--preemption-handler"),
}
KILLS = {
    # SIGKILL in step 5's batch end: the newest save is step 4's, logged after that save: step 4's rows.
    "mid_epoch": ("--kill-at", 5, "--signal", "kill"),
    # SIGKILL in epoch 1's validation (at step 8, after the save of step 8): the restart runs it again.
    "validation": ("--kill-at", 8, "--signal", "kill", "--kill-in", "val"),
    # SIGKILL as epoch 2's first batch starts: the epoch-end save (step 8) is written, the epoch's
    # validation logged its figure at step 8 before it, the epoch-start rate at step 8 after it.
    "epoch_end": ("--kill-at", 8, "--signal", "kill", "--kill-in", "epoch_start"),
    # SIGTERM at step 7: saved at a batch boundary (Lightning's own path: in on_exception, exit 0;
    # PreemptionHandler's: at the next batch end, exit 143).
    "sigterm": ("--kill-at", 7, "--signal", "term"),
    # SIGTERM inside epoch 1's validation: PreemptionHandler saves inside it (the restart runs that
    # validation again), Lightning's own path after it.
    "sigterm_in_validation": ("--kill-at", 8, "--signal", "term", "--kill-in", "val"),
}
#: How a SIGTERM'd attempt ends, and what its restart says of the logs: after Lightning's own stop
#: nothing follows the save (the stopped attempt's logs are kept whole).
STOPPED = {"local": (0, "kept whole"), "default": (143, "cut back to the checkpoint loaded")}


def _logs(workdir: Path, setup: str) -> tuple[Path, Path | None]:
    """The TensorBoard and CSV version dirs of ``setup`` in ``workdir``."""
    if setup == "local":
        logs = workdir / "trackers" / "lightning_logs"
        return logs / "fixed", logs / "version_0"
    return workdir / "lightning_logs" / "version_0", None


def read_logs(workdir: Path, setup: str) -> dict[str, Any]:
    tensorboard, csv_dir = _logs(workdir, setup)
    return {
        "shown": tensorboard_view(tensorboard),
        "events": tensorboard_events(tensorboard),
        "rows": csv_rows(csv_dir / "metrics.csv") if csv_dir else None,
        "versions": sorted(p.name for p in tensorboard.parent.iterdir()),
    }


def uninterrupted(tmp_path_factory: pytest.TempPathFactory, setup: str) -> dict[str, Any]:
    def build(folder: Path) -> None:
        done = run_tracker_job(folder, SETUPS[setup][0], *LOGGED, *SETUPS[setup][1:])
        assert done.finished, done.output[-3000:]

    return read_logs(built_once(tmp_path_factory, f"local-logs-{setup}", build), setup)


def _differences(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    found = (
        [f"versions {got['versions']} vs {expected['versions']}"]
        if got["versions"] != expected["versions"]
        else []
    )
    for tag in sorted(set(expected["shown"]) | set(got["shown"])):
        want, have = expected["shown"].get(tag, []), got["shown"].get(tag, [])
        if want != have:
            steps = [step for step, *_ in have], [step for step, *_ in want]
            found.append(
                f"{tag}: steps {steps[0]} vs {steps[1]}"
                + (" (values differ)" if steps[0] == steps[1] else "")
            )
    extra = {
        k: (v, expected["events"].get(k)) for k, v in got["events"].items() if expected["events"].get(k) != v
    }
    missing = {k: v for k, v in expected["events"].items() if k not in got["events"]}
    if extra or missing:
        found.append(f"(tag, step) counts differ: {extra} missing {missing}")
    if got["rows"] != expected["rows"]:
        found.append(f"metrics.csv rows differ: {got['rows']} vs {expected['rows']}")
    return found


def _param(setup: str, kill: str, fast: bool = False) -> Any:
    marks: list[Any] = [] if fast else [pytest.mark.slow]
    return pytest.param(setup, kill, id=f"{setup}-{kill}", marks=marks)


@pytest.mark.parametrize(
    ("setup", "kill"),
    [_param("default", "epoch_end", fast=True)]
    + [
        _param(setup, kill) for setup in SETUPS for kill in KILLS if (setup, kill) != ("default", "epoch_end")
    ],
)
def test_the_logs_after_a_restart_are_the_uninterrupted_runs(
    setup: str, kill: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    expected = uninterrupted(tmp_path_factory, setup)
    tracker, *options = SETUPS[setup]
    stopped = run_tracker_job(tmp_path, tracker, *LOGGED, *options, *KILLS[kill], LIGHTNING_RESUME_KEY="k")
    status, how = STOPPED[setup] if kill.startswith("sigterm") else (-9, "cut back to the checkpoint loaded")
    if kill == "sigterm_in_validation":  # saved as that validation starts again: its position recorded
        how = "cut back to the checkpoint loaded"
    assert stopped.returncode == status, stopped.output[-3000:]
    assert not stopped.finished
    restart = run_tracker_job(tmp_path, tracker, *LOGGED, *options, LIGHTNING_RESUME_KEY="k")
    assert restart.finished, restart.output[-3000:]
    assert "resuming from" in restart.output, restart.output[-3000:]
    assert f"tensorboard logs {how}" in restart.output, restart.output[-3000:]
    got = read_logs(tmp_path, setup)
    assert not _differences(expected, got), "; ".join(_differences(expected, got))
    # What the test relies on is there: media, the epoch-start rate at the saved step, hp_metric once.
    shown = got["shown"]
    assert {"images/weights", "histograms/weight_values", "tensors/note/text_summary"} <= set(shown)
    assert [step for step, _ in shown["scalars/lr-SGD"]] == [0, 4, 8]
    assert got["events"][("hp_metric", 0)] == 1  # logged by every attempt's start, kept once


# -- in one process ---------------------------------------------------------------------------------


class Echo(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("echo", float(self.global_step))
        return super().training_step(batch, batch_idx)


class StopAtTrainStart(pl.Callback):
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise RuntimeError("stopped before the first batch")


def attempt(tmp_path: Path, steps: int, hparams: dict[str, Any], *extra: pl.Callback) -> pl.Trainer:
    """One attempt in this process, its loggers given ``hparams`` before ``fit`` (as
    lightning-hydra-template's ``log_hyperparameters`` does)."""
    logs = tmp_path / "logs"
    loggers = [CSVLogger(logs, name="csv"), TensorBoardLogger(logs, name="tb", default_hp_metric=False)]
    callbacks = [RunDir(root=tmp_path / "runs", key="k"), RequeueCheckpoint(every_n_train_steps=1)]
    trainer = tiny_trainer(
        *callbacks,
        LocalLoggerResume(),
        *extra,
        tmp_path=tmp_path,
        logger=loggers,
        max_steps=steps,
        max_epochs=3,
        log_every_n_steps=1,
    )
    for logger in trainer.loggers:
        logger.log_hyperparams(hparams)
    trainer.fit(Echo())
    return trainer


def test_hparams_logged_before_fit_leave_one_version_dir_per_logger(tmp_path: Path) -> None:
    attempt(tmp_path, 3, {"lr": 0.1, "launch": 1})
    attempt(tmp_path, 6, {"lr": 0.1, "launch": 2})
    for name in ("csv", "tb"):
        assert sorted(p.name for p in (tmp_path / "logs" / name).iterdir()) == ["version_0"], name
    version = tmp_path / "logs" / "csv" / "version_0"
    assert yaml.safe_load((version / "hparams.yaml").read_text()) == {"lr": 0.1, "launch": 2}
    assert [step for step, _ in csv_steps(version)] == list(range(6))
    tensorboard = tmp_path / "logs" / "tb" / "version_0"
    assert [step for step, _ in echo_steps(tensorboard)] == list(range(6))


def test_a_restart_stopped_before_its_first_batch_cuts_at_the_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    attempt(tmp_path, 3, {"launch": 1})
    caplog.set_level(logging.INFO, logger="lightning_resume")
    with pytest.raises(RuntimeError, match="stopped before the first batch"):
        attempt(tmp_path, 6, {"launch": 2}, StopAtTrainStart())
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("lightning_resume.trackers")]
    assert "Restart: csv logs cut back to the checkpoint loaded" in lines, lines
    assert [step for step, _ in csv_steps(tmp_path / "logs" / "csv" / "version_0")] == [0, 1, 2]
    attempt(tmp_path, 6, {"launch": 3})  # and the next restart goes on from there
    assert [step for step, _ in csv_steps(tmp_path / "logs" / "csv" / "version_0")] == list(range(6))


def test_the_one_requeue_checkpoint_puts_in_stands_down_beside_the_users(tmp_path: Path) -> None:
    trainer = attempt(tmp_path, 2, {})
    resumes = [cb for cb in trainer.callbacks if isinstance(cb, LocalLoggerResume)]  # type: ignore[attr-defined]
    assert len(resumes) == 1
    bare = tiny_trainer(
        RunDir(root=tmp_path / "runs2", key="k"),
        RequeueCheckpoint(),
        tmp_path=tmp_path,
        logger=CSVLogger(tmp_path / "logs2"),
        max_steps=2,
    )
    bare.fit(Echo())
    put_in = [cb for cb in bare.callbacks if isinstance(cb, LocalLoggerResume)]  # type: ignore[attr-defined]
    assert len(put_in) == 1
    run_dir = next((tmp_path / "runs2").glob("*/*/*"))
    assert read_sidecar_file(run_dir, "csv")["identity"]["version"] == 0


# -- the file functions -----------------------------------------------------------------------------


def _record(data: bytes) -> bytes:
    """A TFRecord as the writers frame it (the checksums are not read by the cut)."""
    return struct.pack("<QI", len(data), 0) + data + struct.pack("<I", 0)


def test_a_cut_keeps_whole_records_and_removes_newer_files(tmp_path: Path) -> None:
    first, second, third = _record(b"a" * 10), _record(b"b" * 20), _record(b"c" * 5)
    (tmp_path / "events.out.tfevents.1.host.1.0").write_bytes(first + second + third[:7])  # torn by a kill
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "events.out.tfevents.2.host.1.1").write_bytes(first + second)
    (tmp_path / "events.out.tfevents.3.host.2.0").write_bytes(first)  # made after the position
    files = _local_logs.event_files(tmp_path)
    assert files == {
        "events.out.tfevents.1.host.1.0": len(first + second) + 7,
        "sub/events.out.tfevents.2.host.1.1": len(first + second),
        "events.out.tfevents.3.host.2.0": len(first),
    }
    assert _local_logs.whole_records(tmp_path / "events.out.tfevents.1.host.1.0") == len(first + second)
    keep = {"events.out.tfevents.1.host.1.0": math.inf, "sub/events.out.tfevents.2.host.1.1": len(first) + 3}
    _local_logs.cut_events(tmp_path, keep)
    assert _local_logs.event_files(tmp_path) == {
        "events.out.tfevents.1.host.1.0": len(first + second),
        "sub/events.out.tfevents.2.host.1.1": len(first),
    }


def test_a_cut_event_file_reads_back_with_tensorboard(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path)
    for step in range(3):
        writer.add_scalar("x", float(step), step)
    writer.flush()
    position = _local_logs.event_files(tmp_path)
    for step in range(3, 6):
        writer.add_scalar("x", float(step), step)
    writer.close()
    (name,) = position
    with open(tmp_path / name, "ab") as f:
        f.write(_record(b"half")[:9])  # a record cut short by a kill
    _local_logs.cut_events(tmp_path, position)
    assert tensorboard_view(tmp_path)["scalars/x"] == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_metrics_cut_keeps_the_first_rows_and_drops_a_torn_one(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("echo,epoch,loss,step,val\n0,0,1.5,0,\n1,0,1.4,1,\n,0,,1,7\n2,0,1.")
    assert _local_logs.set_aside_metrics(tmp_path)
    assert not (tmp_path / "metrics.csv").exists()
    assert _local_logs.count_rows(tmp_path / _local_logs.KEPT) == 3
    (tmp_path / "metrics.csv").write_text("epoch,hp,step\n0,1,0\n")  # this attempt's start: cut too
    header = _local_logs.cut_metrics(tmp_path, 2, own=False)
    assert header == ["echo", "epoch", "loss", "step"]  # the columns with a value, as CSVLogger sorts them
    with open(tmp_path / "metrics.csv", newline="") as f:
        assert list(csv.reader(f)) == [header, ["0", "0", "1.5", "0"], ["1", "0", "1.4", "1"]]
    assert not (tmp_path / _local_logs.KEPT).exists()


def test_a_kept_file_of_a_restart_that_died_before_its_cut_stays(tmp_path: Path) -> None:
    (tmp_path / _local_logs.KEPT).write_text("step\n0\n")
    (tmp_path / "metrics.csv").write_text("step\n0\n")  # what that restart logged while starting
    assert _local_logs.set_aside_metrics(tmp_path)
    assert (tmp_path / _local_logs.KEPT).read_text() == "step\n0\n"
    assert not (tmp_path / "metrics.csv").exists()
    _local_logs.put_back_metrics(tmp_path)
    assert (tmp_path / "metrics.csv").read_text() == "step\n0\n"


def test_positions_are_kept_for_the_recent_saves(tmp_path: Path) -> None:
    path = tmp_path / "logs" / _local_logs.CUTS
    assert _local_logs.read_cuts(path) == {}
    for n in range(20):
        _local_logs.record_cuts(path, [f"t{n}"], {"csv": {"rows": n}})
    _local_logs.record_cuts(path, ["a", "b"], {"csv": {"rows": 99}})
    cuts = _local_logs.read_cuts(path)
    assert list(cuts) == [f"t{n}" for n in range(6, 20)] + ["a", "b"]
    assert cuts["a"] == cuts["b"] == {"csv": {"rows": 99}}
    path.write_text("not json")
    assert _local_logs.read_cuts(path) == {}


def test_quiet_deletion_warning_matches_only_its_dir_until_removed(tmp_path: Path) -> None:
    owner = type("Owner", (), {})()
    message = "Experiment logs directory lightning_logs/version_{} exists and is not empty."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet = QuietLightning(owner, log_dir_exists(tmp_path / "lightning_logs" / "version_0"))
        warnings.warn(message.format(0), stacklevel=1)
        warnings.warn(message.format(1), stacklevel=1)
        quiet.remove()
        warnings.warn(message.format(0), stacklevel=1)
    assert [str(w.message) for w in caught] == [message.format(1), message.format(0)]
