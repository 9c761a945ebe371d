"""What ``lightning-resume check`` compares between two runs of one command: each rank's steps, the final
state, what the loggers recorded, and the run's own records (run dir, logger versions, self-checks)."""

from __future__ import annotations

import collections
import csv
import json
import math
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_resume._scheduler.environment import final_path
from lightning_resume.run_dir import attempts, layout

if TYPE_CHECKING:
    import torch

Records = list[dict[str, Any]]
Logged = dict[tuple[str, int], list[str]]

TROUBLESHOOTING = "docs/src/troubleshooting.md#lightning-resume-check-says-not-exact"
#: What to do, by the field that differed (the troubleshooting page says more).
REMEDY = {
    "batch": "the loader has no state_dict and cannot be positioned (a custom batch sampler, persistent "
    "workers) or the dataset draws from a generator of its own: use torchdata's StatefulDataLoader",
    "position": "a loader of unknown length restarts its epoch: give it a state_dict (StatefulDataLoader)",
    "loss": "state the step uses is not in the checkpoint (a non-persistent buffer, a callback without "
    "state_dict, a generator of your own)",
    "weights": "optimizer or module state outside the checkpoint (see the self-check's verdict)",
    "optimizer": "a learning rate or scheduler changed in a hook the restart skips",
    "scheduler": "a scheduler stepped in a hook the restart skips or repeats",
    "step": "the restart redid or skipped steps",
    "logs": "keep RequeueCheckpoint's LocalLoggerResume (TensorBoard, CSV: a logger of your own writing "
    "files elsewhere is not cut) and add the tracker's resume callback",
    "run dir": "RunDir's root or key changed between attempts",
    "logger version": "give the logger no version of its own per attempt (RequeueCheckpoint's "
    "LocalLoggerResume keeps one version dir for Lightning's TensorBoard and CSV loggers)",
    "exit status": "a scheduler takes status 0 as finished and never requeues: add PreemptionHandler()",
    "restart": "fix what the error line says",
    "final state": "fit did not reach its end",
}
NOT_REPRODUCIBLE = (
    "exactness cannot be judged on a run that is not reproducible; usual causes: no "
    "seed_everything(..., workers=True) (or a seed drawn at run time), Trainer(deterministic=False) with "
    "nondeterministic ops, a data order or augmentation from the wall clock or an unseeded generator"
)


@dataclass(frozen=True)
class Difference:
    """One thing that differs from the uninterrupted run: its field, what, and the step (if any)."""

    field: str
    detail: str
    step: int | None = None


def parse(lines: list[str]) -> Records:
    """The records of timeline lines (a line torn by a kill is left out)."""
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def read_timeline(folder: Path) -> dict[int, list[Records]]:
    """Each rank's attempts that reached training, oldest first."""
    ranks: dict[int, list[Records]] = {}
    for path in sorted(folder.glob("timeline.rank-*.jsonl")):
        found: list[Records] = []
        for record in parse(path.read_text().splitlines()):
            if record.get("e") == "start" or not found:
                found.append([])
            found[-1].append(record)
        ranks[int(path.stem.rsplit("-", 1)[1])] = found
    return ranks


def trajectory(tried: list[Records]) -> dict[tuple[int, int, int], dict[str, Any]]:
    """The batches and optimizer steps that made the final result, by ``(step, 0 batch / 1 step, n)``."""
    kept: dict[tuple[int, int, int], dict[str, Any]] = {}
    for records in tried:
        resumed = records[0]["s"] if records[0]["e"] == "start" else 0
        kept = {key: r for key, r in kept.items() if key[0] < resumed}  # a resume replaces what followed
        seen: collections.Counter[tuple[int, int]] = collections.Counter()
        for r in records:
            if r["e"] in ("batch", "step"):
                at = (r["s"] - 1, 1) if r["e"] == "step" else (r["s"], 0)
                kept[(at[0], at[1], seen[at])] = r
                seen[at] += 1
    return kept


def step_difference(reference: list[Records], run: list[Records]) -> Difference | None:
    """The first step where ``run`` trained another batch, or got another loss or weights."""
    want, got = trajectory(reference), trajectory(run)
    for key in sorted(want.keys() | got.keys()):
        a, b, step = want.get(key), got.get(key), key[0]
        if a is None or b is None:
            what = "was trained, the uninterrupted run has no such step" if a is None else "was never trained"
            return Difference("position", f"step {step} {what}", step)
        if key[1] == 0 and (a["ep"], a["i"]) != (b["ep"], b["i"]):
            now, was = f"batch {b['i']} of epoch {b['ep']}", f"batch {a['i']} of epoch {a['ep']}"
            return Difference("position", f"step {step} trains {now}, not {was}", step)
        for name, field in (("d", "batch"), ("loss", "loss"), ("w", "weights")):
            if name in a and a[name] != b.get(name):
                return Difference(field, f"the {field} differs from step {step}", step)
    return None


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    import torch  # torch only when states are compared: the check's bad input answers at once

    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def unequal(a: Any, b: Any, where: str = "") -> str | None:
    """Where two (nested) states first differ, bit for bit (``None``: equal)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        same = same and a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))
        return None if same else where or "."
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if list(a) != list(b):
            return f"{where} (keys)"
        found = (unequal(a[k], b[k], f"{where}.{k}".lstrip(".")) for k in a)
        return next((f for f in found if f is not None), None)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where} (length)"
        found = (unequal(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True)))
        return next((f for f in found if f is not None), None)
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return None if both_nan or (type(a) is type(b) and a == b) else where or "."


_FINAL = (("state_dict", "weights"), ("optimizers", "optimizer"), ("schedulers", "scheduler"))


def final_difference(reference: Path, folder: Path, ranks: int) -> Difference | None:
    """The first difference of the final states (every rank's dump at the end of ``fit``)."""
    import torch

    for rank in range(ranks):
        try:
            want = torch.load(final_path(reference, rank), map_location="cpu", weights_only=False)
            got = torch.load(final_path(folder, rank), map_location="cpu", weights_only=False)
        except FileNotFoundError:
            return Difference("final state", f"rank {rank} wrote no final state: fit did not reach its end")
        for key, field in (("global_step", "step"), ("epoch", "step")):
            if want[key] != got[key]:
                return Difference(field, f"the run ended at {key} {got[key]}, not {want[key]}")
        for key, field in _FINAL:
            where = unequal(want[key], got[key])
            if where is not None:
                return Difference(field, f"the final {field} differ at {where} (rank {rank})")
    return None


def _tensorboard(log_dir: Path) -> Logged:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()  # as TensorBoard shows them: events purged by a restart's SessionLog(START) left out
    found: Logged = collections.defaultdict(list)
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            found[(tag, event.step)].append(repr(event.value))
    return found


def _csv(log_dir: Path) -> Logged:
    found: Logged = collections.defaultdict(list)
    with open(log_dir / "metrics.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if key != "step" and value:
                    found[(key, int(row["step"]))].append(value)
    return found


def _trackio(folder: Path) -> Logged:
    found: Logged = collections.defaultdict(list)
    for db in sorted(folder.glob("*.db")):
        with sqlite3.connect(db) as conn:
            for step, metrics in conn.execute("SELECT step, metrics FROM metrics ORDER BY id"):
                for key, value in json.loads(metrics).items():
                    found[(key, int(step))].append(repr(value))
    return found


def logged(folder: Path, loggers: list[list[str]]) -> dict[str, Logged]:
    """What each logger of a run recorded, by ``(tag, step)``: TensorBoard scalars, CSV cells, trackio."""
    found: dict[str, Logged] = {}
    for n, (kind, log_dir) in enumerate(loggers):
        reader = {"TensorBoardLogger": _tensorboard, "CSVLogger": _csv}.get(kind)
        if reader is not None and Path(log_dir).is_dir():
            try:
                found[f"{kind}#{n}"] = reader(Path(log_dir))
            except (ImportError, OSError):
                continue  # no reader here (tensorboard not installed), or nothing written
    if (folder / "trackio").is_dir():
        found["trackio"] = _trackio(folder / "trackio")
    return found


def log_difference(reference: dict[str, Logged], run: dict[str, Logged]) -> Difference | None:
    """The first ``(tag, step)`` (by step) a logger recorded another number of times or values."""
    for name in sorted(reference.keys() | run.keys()):
        want, got = reference.get(name, {}), run.get(name, {})
        for tag, step in sorted(want.keys() | got.keys(), key=lambda k: (k[1], k[0])):
            a, b = sorted(want.get((tag, step), [])), sorted(got.get((tag, step), []))
            if a != b:
                what = f"{b} instead of {a}" if len(a) == len(b) else f"logged {len(b)} times, not {len(a)}"
                return Difference("logs", f"{name.split('#')[0]} {tag!r} at step {step}: {what}", step)
    return None


def record_differences(folder: Path, tried: list[Records]) -> list[Difference]:
    """One run dir, and one log dir per logger, over every attempt of a run."""
    found = []
    run_dirs = {str(r[0].get("run_dir")) for r in tried} | {str(p) for p in layout.run_dirs(folder / "runs")}
    if len(run_dirs) > 1:
        found.append(Difference("run dir", f"{len(run_dirs)} run dirs: {', '.join(sorted(run_dirs))}"))
    by_logger = collections.defaultdict(set)
    for records in tried:
        for n, (kind, log_dir) in enumerate(records[0].get("loggers", [])):
            by_logger[(n, kind)].add(log_dir)
    for (_, kind), dirs in sorted(by_logger.items()):
        if len(dirs) > 1:
            found.append(Difference("logger version", f"{kind} logged into {len(dirs)} dirs: {sorted(dirs)}"))
    return found


def verdicts(folder: Path) -> list[str]:
    """The resume self-check's verdict of each resumed attempt (``attempts.json``)."""
    return [
        a.self_check or "unchecked"
        for run_dir in layout.run_dirs(folder / "runs")
        for a in attempts.read(run_dir).attempts
        if a.resumed_from is not None
    ]


def differences(reference: Path, folder: Path) -> list[Difference]:
    """Everything in which the run in ``folder`` differs from the uninterrupted one in ``reference``."""
    want, got = read_timeline(reference), read_timeline(folder)
    steps = (step_difference(want[rank], got.get(rank, [])) for rank in sorted(want))
    found = [d for d in steps if d is not None][:1]
    final = final_difference(reference, folder, len(want))
    found += [final] if final is not None else []
    loggers = [r[-1][0].get("loggers", []) if r else [] for r in (want.get(0), got.get(0))]
    logs = log_difference(logged(reference, loggers[0]), logged(folder, loggers[1]))
    found += [logs] if logs is not None else []
    return found + record_differences(folder, got.get(0, []))
