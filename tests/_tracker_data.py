"""Helpers for the tracker tests: run ``tracker_job.py`` offline, and read each tracker's own storage.

Readers return plain data read from the files the trackers wrote (wandb ``.wandb`` logs, trackio's
SQLite database, swanlab ``.swanlab`` logs), never from the trackers' in-memory state.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from conftest import job_env

JOB = Path(__file__).parent / "jobs" / "tracker_job.py"
# Anything a tracker might contact goes to this address: nothing listens there, so an attempt fails
# fast instead of reaching the network.
DEAD_URL = "http://127.0.0.1:9"


def offline_env(home: Path) -> dict[str, str]:
    """Offline settings for every tracker, their files kept under ``home``."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(home / "wandb-config"),
        "WANDB_CACHE_DIR": str(home / "wandb-cache"),
        "WANDB_DATA_DIR": str(home / "wandb-data"),
        "SWANLAB_MODE": "offline",
        "SWANLAB_SAVE_DIR": str(home / "swanlab-home"),
        "HF_HUB_OFFLINE": "1",
        "TRACKIO_DIR": str(home / "trackio"),
        # Comet offline: no API key, no config file.
        "COMET_START_ONLINE": "false",
        "COMET_API_KEY": "",
        "COMET_CONFIG": str(home / "comet-config-none"),
    }


def dead_network_env(url: str = DEAD_URL) -> dict[str, str]:
    """Send every proxy and tracker endpoint to ``url``."""
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "ALL_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "all_proxy": url,
        "NO_PROXY": "",
        "no_proxy": "",
        "WANDB_BASE_URL": url,
        "SWANLAB_API_HOST": url,
        "SWANLAB_WEB_HOST": url,
        "HF_ENDPOINT": url,
        "COMET_URL_OVERRIDE": f"{url}/clientlib/",
    }


@dataclass
class Attempt:
    returncode: int
    output: str
    finished: bool


def run_tracker_job(
    workdir: Path, tracker: str, *args: str | int, timeout: float = 180, **env: str | int | None
) -> Attempt:
    """Run ``tracker_job.py`` once in ``workdir`` (offline, network dead) and return how it ended."""
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    out = workdir / "result.json"
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(JOB),
        "--root",
        "runs",
        "--tracker",
        tracker,
        "--out",
        str(out),
        *map(str, args),
    ]
    # TMPDIR: Comet keeps an offline experiment's data in a temporary dir; a killed job leaves it here.
    full_env = job_env(
        **{**offline_env(workdir), **dead_network_env(), "TMPDIR": str(workdir / "tmp"), **env}
    )
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(JOB.parent), full_env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, cwd=workdir, env=full_env, capture_output=True, text=True, timeout=timeout)
    return Attempt(proc.returncode, proc.stdout + proc.stderr, out.exists())


def preempt(tmp_path: Path, tracker: str, job: int, kills: list[int], *args: str | int, **env: str) -> None:
    """Run attempts until one finishes; each attempt but the last gets SIGTERM at its kill step."""
    for attempt, kill in enumerate([*kills, None]):
        extra = [*args] + (["--kill-at", kill] if kill is not None else [])
        result = run_tracker_job(
            tmp_path, tracker, *extra, SLURM_JOB_ID=job, SLURM_RESTART_COUNT=attempt or None, **env
        )
        assert result.returncode == 0, result.output
        assert result.finished == (kill is None), result.output


# -- the LevelDB-style log both wandb and swanlab write ----------------------------------------------

_BLOCK = 32768
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def leveldb_records(path: Path, ident: bytes) -> list[bytes]:
    """The records of a LevelDB-style log: a 7-byte file header, then 32 KiB blocks of chunks."""
    data = path.read_bytes()
    assert data[:4] == ident, f"{path} does not start with {ident!r}"
    records, pending, pos = [], b"", _CHUNK_HEADER
    while pos + _CHUNK_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:  # block tail padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        if kind == 0 and length == 0:  # zero fill at the end of an unfinished file
            break
        chunk = data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length]
        pos += _CHUNK_HEADER + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            records.append(pending + chunk)
            pending = b""
    return records


# -- wandb ----------------------------------------------------------------------------------------


@dataclass
class WandbRun:
    """One offline run folder (one process attempt)."""

    folder: Path
    run_id: str
    project: str | None
    history: list[dict[str, Any]] = field(default_factory=list)


def wandb_runs(save_dir: Path) -> list[WandbRun]:
    """Every ``wandb/offline-run-*`` under ``save_dir``, oldest first."""
    from wandb.proto import wandb_internal_pb2

    runs = []
    for file in sorted(save_dir.glob("wandb/offline-run-*/run-*.wandb")):
        run: WandbRun | None = None
        history = []
        for raw in leveldb_records(file, b":W&B"):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "run" and run is None:
                run = WandbRun(file.parent, record.run.run_id, record.run.project)
            elif kind == "history":
                items = record.history.item
                history.append(
                    {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}
                )
        if run is None:  # a SIGKILLed attempt: wandb had not flushed anything but the file header
            run = WandbRun(file.parent, file.stem.removeprefix("run-"), None)
        run.history = history
        runs.append(run)
    return runs


# -- swanlab --------------------------------------------------------------------------------------


@dataclass
class SwanLabRun:
    """One swanlab run folder (one process attempt)."""

    folder: Path
    run_id: str
    project: str
    name: str
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def swanlab_runs(log_dir: Path) -> list[SwanLabRun]:
    """Every ``run-*`` folder under ``log_dir``, oldest first."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    runs = []
    for file in sorted(log_dir.glob("run-*/run-*.swanlab")):
        run: SwanLabRun | None = None
        scalars: dict[str, list[tuple[int, float]]] = {}
        for raw in leveldb_records(file, b":SWL"):
            record = Record()
            record.ParseFromString(raw)
            if record.HasField("start"):
                run = SwanLabRun(file.parent, record.start.id, record.start.project, record.start.name)
            elif record.HasField("scalar"):
                scalars.setdefault(record.scalar.key, []).append(
                    (record.scalar.step, record.scalar.value.number)
                )
        assert run is not None, f"no start record in {file}"
        run.scalars = scalars
        runs.append(run)
    return runs


# -- trackio --------------------------------------------------------------------------------------

_trackio_dir: Path | None = None


def trackio_dir_for_tests() -> Path:
    """The folder trackio uses in this pytest process.

    trackio reads ``TRACKIO_DIR`` once, when it is first imported; call this at import time of a test
    module, before any test imports trackio, so that in-process runs go to a temporary folder.
    """
    global _trackio_dir
    if _trackio_dir is None:
        if "trackio" in sys.modules:
            _trackio_dir = Path(sys.modules["trackio"].utils.TRACKIO_DIR)
        else:
            _trackio_dir = Path(tempfile.mkdtemp(prefix="lr-trackio-"))
            atexit.register(shutil.rmtree, _trackio_dir, True)
            os.environ["TRACKIO_DIR"] = str(_trackio_dir)
    return _trackio_dir


@dataclass
class TrackioRow:
    run_id: str
    run_name: str
    step: int
    metrics: dict[str, Any]


def trackio_rows(trackio_dir: Path, project: str) -> list[TrackioRow]:
    """The ``metrics`` rows of a trackio project's SQLite database, in insertion order."""
    db = trackio_dir / f"{project}.db"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT run_id, run_name, step, metrics FROM metrics ORDER BY id").fetchall()
    return [TrackioRow(run_id, name, step, json.loads(metrics)) for run_id, name, step, metrics in rows]


def read_sidecar_file(run_dir: Path, tracker: str) -> dict[str, Any]:
    """The sidecar JSON as written."""
    return json.loads((run_dir / f"{tracker}_resume.json").read_text())


def only_run_dir(workdir: Path) -> Path:
    """The single run dir ``tracker_job.py`` created under ``workdir/runs``."""
    found = list((workdir / "runs").glob("[0-9]*/[0-9]*/*"))
    assert len(found) == 1, found
    return found[0]


# -- in-process runs ------------------------------------------------------------------------------


class StepCounter(pl.Callback):
    """Counts the training batches a fit actually ran."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1


def fit_tiny(
    root: Path, logger: Any, *callbacks: Any, key: str = "job-1", steps: int = 4, every: int = 1
) -> Any:
    """Fit ``tracker_job.Model`` in this process for ``steps`` steps under run-dir session ``key``.

    A second call with the same ``root`` and ``key`` is a restart (the key is already indexed).
    Callbacks are listed before the ``RunDir``, and the ``RunDir`` is constructed last.
    """
    import torch
    from jobs.tracker_job import BATCH, Model
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_resume import RequeueCheckpoint, RunDir

    all_callbacks = [*callbacks, RequeueCheckpoint(every_n_train_steps=every), RunDir(root=root, key=key)]
    x = torch.randn(32 * BATCH, 8, generator=torch.Generator().manual_seed(0))
    trainer = pl.Trainer(
        max_steps=steps,
        max_epochs=None,  # a restart after max_steps continues the same epoch
        accelerator="cpu",
        logger=logger,
        callbacks=all_callbacks,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=root,
    )
    trainer.fit(
        Model(), train_dataloaders=DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH)
    )
    return trainer


# -- TensorBoard and CSV ----------------------------------------------------------------------------


def tensorboard_view(log_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    """What TensorBoard shows of ``log_dir``, read with its ``EventAccumulator`` keeping everything:
    ``kind/tag`` -> ``(step, value)`` in order; images, histograms and tensors (text, hparams) as their
    serialized contents, so that equal means equal bytes."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    keep_all = {
        "scalars": 0,
        "images": 0,
        "histograms": 0,
        "tensors": 0,
        "audio": 0,
        "compressedHistograms": 0,
    }
    accumulator = EventAccumulator(str(log_dir), size_guidance=keep_all)
    accumulator.Reload()
    tags = accumulator.Tags()
    view: dict[str, list[tuple[Any, ...]]] = {}
    for tag in tags["scalars"]:
        view[f"scalars/{tag}"] = [(e.step, e.value) for e in accumulator.Scalars(tag)]
    for tag in tags["images"]:
        view[f"images/{tag}"] = [(e.step, e.encoded_image_string) for e in accumulator.Images(tag)]
    for tag in tags["histograms"]:
        view[f"histograms/{tag}"] = [(e.step, str(e.histogram_value)) for e in accumulator.Histograms(tag)]
    for tag in tags["tensors"]:
        view[f"tensors/{tag}"] = [
            (e.step, e.tensor_proto.SerializeToString()) for e in accumulator.Tensors(tag)
        ]
    return view


def tensorboard_events(log_dir: Path) -> dict[tuple[str, int], int]:
    """How often each ``(tag, step)`` is in the event files under ``log_dir`` (every record, in files
    read whole by TensorBoard's own loader: a purge hides nothing here)."""
    from collections import Counter

    from tensorboard.backend.event_processing import event_file_loader

    counts: Counter[tuple[str, int]] = Counter()
    for file in sorted(log_dir.rglob("events.out.tfevents.*")):
        for event in event_file_loader.EventFileLoader(str(file)).Load():
            for value in event.summary.value:
                counts[(value.tag, event.step)] += 1
    return dict(counts)


def csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a ``metrics.csv``, empty fields left out."""
    import csv

    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
