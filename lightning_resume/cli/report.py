"""``lightning-resume report``: a run's attempts on a timeline, what each interruption cost, and its goodput,
all read from the run's ``attempts.json`` (the definitions are on the command-line docs page)."""

from __future__ import annotations

import collections
import itertools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_resume.failure_classes import ending
from lightning_resume.last_ckpt.auto_cadence import last_cadence
from lightning_resume.run_dir import attempts
from lightning_resume.run_dir.attempts import Attempt, Cause, End, History
from lightning_resume.straggler.decision import LABELS

PLOT_HINT = "--plot needs matplotlib: pip install matplotlib"
#: The ``interruptions`` key of launches killed while starting, which left no attempt record.
UNRECORDED = "killed while starting (unrecorded)"


@dataclass(frozen=True)
class AttemptRow:
    """One attempt in the report (seconds; ``*_at`` values count from the run's start)."""

    attempt: int
    started: float  # wall-clock start (seconds since the epoch)
    at: float
    wait_before: float | None  # from the previous attempt's end (its last sign of life, when killed)
    resumed_from: int | None  # None: a fresh start
    restart_overhead: float | None  # start to the end of its first step (None: it never trained)
    first_step_at: float | None
    last_step: int | None
    last_step_at: float | None
    end_at: float | None  # None: running, or killed unrecorded
    cause: str  # finished, preempted, failed, hung, killed, crash-loop-stop or running
    how: str  # the ending in words ("SIGTERM", "file notice", the error)
    steps_trained: int
    steps_kept: int  # of which part of the final result
    steps_lost: int
    lost_at_least: bool  # steps_lost is a lower bound (killed: its last steps were not recorded)
    step_seconds: float | None  # training time per step
    useful_seconds: float  # steps_kept x step_seconds
    save_seconds: float
    saves: int
    cadence_steps: int | None  # the interval every_n_train_steps="auto" chose last in it
    unrecorded_before: int = 0  # launches since the previous attempt killed before they recorded themselves


@dataclass(frozen=True)
class RestartRow:
    """One restart's spans (seconds) from the fault to the first step; ``None`` where an end is unrecorded."""

    attempt: int
    after: str  # how the attempt before ended (its cause)
    to_exit: float | None  # the fault to the exit of the attempt before (its grace: save, teardown)
    relaunch: float | None  # that exit to this attempt's process start (the scheduler's requeue)
    imports: float | None  # the process start to RunDir's construction
    setup: float | None  # RunDir's construction to the load's start (Trainer, data, process group)
    resumed_from: int | None  # the step it resumed from (None: a fresh start)
    restore_tier: str | None  # "durable", "memory" (DurableCheckpointIO), None: not told
    restore_bytes: int | None
    restore_seconds: float | None
    first_step: float | None  # the load's end to the end of the first step
    total: float | None  # the fault to the end of the first step


@dataclass(frozen=True)
class GoodputReport:
    """A run's attempts (oldest first) and what its interruptions cost; totals summed over the attempts."""

    run_dir: str
    attempts: list[AttemptRow]
    wall_seconds: float  # the first attempt's start to the last one's end
    useful_seconds: float
    goodput: float | None  # useful_seconds / wall_seconds (None with no wall time)
    final_step: int  # the last attempt's kept end
    steps_lost: int
    restart_seconds: float
    save_seconds: float
    wait_seconds: float
    # Attempts per ending that did not finish; launches killed while starting under UNRECORDED.
    interruptions: dict[str, int] = field(default_factory=dict)
    earlier: dict[str, Any] = field(default_factory=dict)  # the attempts attempts.json no longer lists
    cadence: dict[str, Any] | None = None  # the interval every_n_train_steps="auto" chose last
    restarts: list[RestartRow] = field(default_factory=list)  # every attempt after one recorded before it
    # StragglerDetector's record of each attempt that has one: {"attempt": N, **Attempt.stragglers}.
    stragglers: list[dict[str, Any]] = field(default_factory=list)


def _how(end: End | None, retried: bool) -> str:
    """The ending in words, led by the failure class the ranks exited with (but for a preemption)."""
    if end is None:
        return "running, or killed without a record yet"
    if end.cause is Cause.PREEMPTED:
        if end.signal and end.signal.endswith(" notice"):
            return end.signal.removeprefix("the ")
        return (end.signal or "a signal") + (f" after a {end.notice} notice" if end.notice else "")
    words = {
        Cause.FAILED: f"crashed: {end.error or end.detail}",
        Cause.HUNG: end.detail.partition(";")[0],
        Cause.KILLED: "killed (no grace: SIGKILL, OOM, node loss)",
    }.get(end.cause, end.detail or end.cause.value)
    if end.failure is None:
        return words
    return f"{ending(end.failure, end.rank, end.exit_code, retried)}: {words.removeprefix('crashed: ')}"


def _save_seconds(attempt: Attempt) -> tuple[float, int]:
    if attempt.saves.count:
        return attempt.saves.seconds, attempt.saves.count
    return attempt.last_ckpt_saves.stall_seconds, attempt.last_ckpt_saves.count


def _step_seconds(attempt: Attempt) -> float | None:
    """Training time per step: its first step's end to its last step, save stalls left out."""
    if attempt.first_step is None or attempt.last_step_time is None or attempt.last_step is None:
        return None
    steps = attempt.last_step - (attempt.resumed_from or 0) - 1  # the steps after the first one
    if steps < 1:
        return None
    seconds = attempt.last_step_time - attempt.first_step - _save_seconds(attempt)[0]
    return max(seconds, 0.0) / steps


def _span(start: float | None, end: float | None) -> float | None:
    """Seconds from ``start`` to ``end``, both recorded (clocks of two hosts may differ: not clamped)."""
    return None if start is None or end is None else end - start


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def restart_row(before: Attempt, attempt: Attempt) -> RestartRow:
    """How long ``attempt`` took to train again after the fault that ended ``before``."""
    fault = before.end.fault if before.end is not None else None
    # A start after our code ran is no process start: without /proc, ``started`` is when ``fit`` began.
    measured = attempt.code_started is None or attempt.started <= attempt.code_started
    started = attempt.started if measured else None
    restore = attempt.restore or {}
    began = _number(restore.get("started")) or None  # 0.0: not told
    tier, size = restore.get("tier"), _number(restore.get("bytes"))
    return RestartRow(
        attempt=attempt.number,
        after=before.end.cause.value if before.end is not None else "running",
        to_exit=_span(fault, before.exited),
        relaunch=_span(before.exited, started),
        imports=_span(started, attempt.code_started),
        setup=_span(attempt.code_started, began),
        resumed_from=attempt.resumed_from,
        restore_tier=tier if isinstance(tier, str) else None,
        restore_bytes=None if size is None else int(size),
        restore_seconds=_number(restore.get("seconds")),
        first_step=_span(attempt.restored_at, attempt.first_step),
        total=_span(fault, attempt.first_step),
    )


def build(history: History, run_dir: Path | str = "") -> GoodputReport:
    """The report of a run's attempt history (definitions: the ``report`` section of ``docs/src/cli.md``)."""
    found = list(history.attempts)
    earlier = history.earlier
    earlier_dict = {"attempts": earlier.attempts, "causes": dict(earlier.causes), "seconds": earlier.seconds}
    if not found:
        return GoodputReport(str(run_dir), [], 0.0, 0.0, None, 0, 0, 0.0, 0.0, 0.0, earlier=earlier_dict)
    origin, last = found[0].started, found[-1]
    trained = {a.number for a in found if a.last_step is not None and a.first_step is not None}
    if last.end is None or last.end.cause is Cause.FINISHED:
        final = last.last_step if last.last_step is not None else 0
    else:
        final = last.checkpoint.step if last.checkpoint is not None else 0
    per_step = [s for a in found if (s := _step_seconds(a)) is not None]
    typical = statistics.median(per_step) if per_step else None
    rows: list[AttemptRow] = []
    previous_end: float | None = None
    for index, attempt in enumerate(found):
        start, end = attempt.resumed_from or 0, attempt.end
        reached = attempt.last_step if attempt.number in trained else None
        later = [a.resumed_from or 0 for a in found[index + 1 :] if a.number in trained]
        cap = min([*later, final])  # a later resume from an earlier step discards the rest
        steps_trained = max(reached - start, 0) if reached is not None else 0
        kept = max(min(reached, cap) - start, 0) if reached is not None else 0
        step = _step_seconds(attempt)
        step = typical if step is None else step
        saved, saves = _save_seconds(attempt)
        end_time = end.time if end is not None else None
        rows.append(
            AttemptRow(
                attempt=attempt.number,
                started=attempt.started,
                at=attempt.started - origin,
                wait_before=None if previous_end is None else max(attempt.started - previous_end, 0.0),
                resumed_from=attempt.resumed_from,
                restart_overhead=_span(attempt.started, attempt.first_step),
                first_step_at=_span(origin, attempt.first_step),
                last_step=attempt.last_step,
                last_step_at=_span(origin, attempt.last_step_time),
                end_at=_span(origin, end_time),
                cause=end.cause.value if end is not None else "running",
                how=_how(end, retried=index < len(found) - 1),
                steps_trained=steps_trained,
                steps_kept=kept,
                steps_lost=steps_trained - kept,
                lost_at_least=end is not None and end.cause is Cause.KILLED and end.step is None,
                step_seconds=step,
                useful_seconds=kept * (step or 0.0),
                save_seconds=saved,
                saves=saves,
                cadence_steps=(attempt.cadence or {}).get("steps"),
                unrecorded_before=attempt.unrecorded_launches,
            )
        )
        previous_end = end_time if end_time is not None else attempt.last_seen
    wall = (last.end.time if last.end is not None else last.last_seen) - origin
    useful = sum(r.useful_seconds for r in rows)
    interruptions: collections.Counter[str] = collections.Counter()
    for row in rows:
        if row.unrecorded_before:
            interruptions[UNRECORDED] += row.unrecorded_before
        if row.cause == Cause.PREEMPTED.value:
            interruptions[f"{row.cause} ({row.how})"] += 1
        elif row.cause not in (Cause.FINISHED.value, "running"):
            interruptions[row.cause] += 1
    return GoodputReport(
        run_dir=str(run_dir),
        attempts=rows,
        wall_seconds=wall,
        useful_seconds=useful,
        goodput=useful / wall if wall > 0 else None,
        final_step=final,
        steps_lost=sum(r.steps_lost for r in rows),
        restart_seconds=sum(r.restart_overhead or 0.0 for r in rows),
        save_seconds=sum(r.save_seconds for r in rows),
        wait_seconds=sum(r.wait_before or 0.0 for r in rows),
        interruptions=dict(interruptions),
        earlier=earlier_dict,
        cadence=last_cadence(history),
        restarts=[restart_row(a, b) for a, b in itertools.pairwise(found)],
        stragglers=[{"attempt": a.number, **a.stragglers} for a in found if a.stragglers],
    )


def report(run_dir: Path) -> GoodputReport:
    """The report of the run dir ``run_dir`` (an empty one when it has no ``attempts.json``)."""
    return build(attempts.read(run_dir), run_dir)


#: The parts of an attempt's bar in the picture and their colours: start-up (process start to its first
#: step's start), useful (the compute of its steps kept: what the goodput counts), lost (the compute of its
#: steps lost), other (the rest of its training time: validation, saves, epoch ends, waiting for data).
PARTS = {"start-up": "#bdbdbd", "useful": "#66bb6a", "lost": "#ef5350", "other": "#90caf9"}
USEFUL = (
    "useful: the compute time of the steps the final result keeps; start-up, validation, saves, epoch "
    "ends, lost steps and waits between attempts are the rest"
)
#: Colours of the endings in the picture.
COLOURS = {
    "finished": "#2e7d32",
    "preempted": "#1565c0",
    "killed": "#c62828",
    "failed": "#6a1b9a",
    "hung": "#ef6c00",
    "crash-loop-stop": "#424242",
    "running": "#9e9e9e",
}


def bar(row: AttemptRow) -> list[tuple[str, float, float]]:
    """``(part, start, seconds)`` of ``row``'s bar (:data:`PARTS`); useful parts sum to the useful time."""
    if row.first_step_at is None:
        return []
    step = row.step_seconds or 0.0
    start = max(row.first_step_at - step, row.at)  # the first step's own compute is training time
    end = max(row.last_step_at if row.last_step_at is not None else row.first_step_at, start)
    lost = row.steps_lost * step
    other = max(end - start - row.useful_seconds - lost, 0.0)
    parts, at = [("start-up", row.at, start - row.at)], start
    for name, seconds in (("useful", row.useful_seconds), ("lost", lost), ("other", other)):
        if seconds > 0:
            parts.append((name, at, seconds))
            at += seconds
    return parts


def plot(found: GoodputReport, path: Path) -> Path:
    """Draw ``found``'s timeline as a PNG at ``path`` and return it; ``ImportError`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(PLOT_HINT) from e
    rows = found.attempts
    scale, unit = (60.0, "min") if found.wall_seconds > 600 else (1.0, "s")
    panels = 3 if found.stragglers else 2
    height = 2.2 + 0.35 * max(len(rows), 1) + 2.5 + 3 * (panels - 2)
    figure, axes = plt.subplots(panels, 1, figsize=(10, height))
    bars, steps = axes[0], axes[1]
    steps.sharex(bars)
    for index, row in enumerate(rows):
        y = len(rows) - index
        for part, at, seconds in bar(row):
            bars.broken_barh([(at / scale, seconds / scale)], (y - 0.3, 0.6), color=PARTS[part])
        if row.first_step_at is not None:
            first, start = row.first_step_at, row.resumed_from or 0
            end = row.last_step_at if row.last_step_at is not None else first
            kept = max(end - first, 0.0) * (row.steps_kept / row.steps_trained if row.steps_trained else 1.0)
            kept_end = (first + kept) / scale
            steps.plot([first / scale, kept_end], [start + 1, start + row.steps_kept], color="#2e7d32")
            if row.steps_lost:
                lost = [kept_end, end / scale], [start + row.steps_kept, row.last_step or 0]
                steps.plot(*lost, color="#c62828", linestyle="--")
        end_at = (row.end_at if row.end_at is not None else (row.last_step_at or row.at)) / scale
        bars.plot([end_at], [y], marker="|", markersize=14, color=COLOURS.get(row.cause, "black"))
        bars.annotate(row.how if row.cause == "preempted" else row.cause, (end_at, y + 0.35), fontsize=7)
    bars.set_yticks(range(1, len(rows) + 1), [f"attempt {r.attempt}" for r in reversed(rows)])
    bars.set_ylim(0.4, len(rows) + 0.9)  # room for the names of the endings
    goodput = "n/a" if found.goodput is None else f"{found.goodput:.1%}"
    bars.set_title(
        f"goodput {goodput}: {found.useful_seconds / scale:.1f} {unit} useful of "
        f"{found.wall_seconds / scale:.1f} {unit}; {found.steps_lost} steps lost\ngreen: the compute of the "
        "steps kept (useful), red: of the steps lost, blue: validation, saves, epoch ends, grey: start-up",
        fontsize=9,
    )
    steps.set_ylabel("global step")
    steps.set_xlabel(f"time since the first attempt started ({unit})")
    if found.stragglers:
        plot_ranks(axes[2], found.stragglers[-1])
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


#: The parts of a rank's step in the ranks' picture, and their colours (``StragglerDetector``).
RANK_PARTS = {"data": "#ffa726", "compute": "#66bb6a", "optimizer": "#7e57c2", "collective": "#bdbdbd"}


def plot_ranks(axes: Any, record: dict[str, Any]) -> None:
    """Draw a ``stragglers`` record on ``axes``: ms per step of each rank by part, the ranks named in red."""
    ranks = record.get("ranks") or []
    named = {s.get("rank"): s.get("part") for s in record.get("named") or []}
    bottom = [0.0] * len(ranks)
    for part, colour in RANK_PARTS.items():
        values = [1000 * (r.get(part) or 0.0) for r in ranks]
        axes.bar(range(len(ranks)), values, bottom=bottom, color=colour, label=LABELS[part])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axes.set_xticks(range(len(ranks)), [str(r.get("rank")) for r in ranks], fontsize=7)
    for label, row in zip(axes.get_xticklabels(), ranks, strict=True):
        label.set_color("#c62828" if row.get("rank") in named else "black")
    said = ", ".join(f"rank {rank} ({LABELS.get(part, part)})" for rank, part in named.items()) or "none"
    axes.set_title(
        f"attempt {record.get('attempt')}: milliseconds per step by rank, over {record.get('windows')} "
        f"windows of {record.get('window')} steps; stragglers named (red): {said}",
        fontsize=9,
    )
    axes.set_xlabel("global rank")
    axes.set_ylabel("ms per step")
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
