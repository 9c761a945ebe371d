"""Tables for the command line (rich on a terminal, plain text when piped), never cropped: columns narrow
to the console's width (80 when piped, or ``$COLUMNS``); a table that cannot fit is one block per row."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from lightning_resume.cli.doctor import Finding, Level
from lightning_resume.cli.gc import Removal
from lightning_resume.cli.report import USEFUL, GoodputReport, RestartRow
from lightning_resume.last_ckpt import auto_cadence
from lightning_resume.run_dir import layout
from lightning_resume.straggler.decision import LABELS, Straggler, milliseconds

_STYLE = {Level.OK: "green", Level.WARN: "yellow", Level.ERROR: "bold red"}
#: Under the restarts table: what each column spans.
RESTART_SPANS = (
    "seconds from the fault (the signal, the error, a hang's last progress, a kill's last step) to rank 0 "
    "of the attempt before exiting, to this attempt's process start (relaunch), to RunDir's construction "
    "(imports), to the checkpoint load's start (setup), through the load (restore: tier, MB, s), to the "
    "end of the first step; total: the fault to the first step; -: not recorded"
)
#: Ranks the per-rank table lists in full; past it, the ranks named and those that waited least.
RANKS_SHOWN = 32


def table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    caption: str | None = None,
    justify: Literal["left", "right"] = "left",
    console: Console | None = None,
) -> None:
    """Print one table, its columns narrowed to the console's width, else one block of lines per row."""
    console = console or Console()
    cells = [list(row) for row in rows]
    widths = _fit(columns, cells, console.width - 3 * len(columns) - 1)  # borders and padding
    if widths is None:
        console.print(title, overflow="fold")
        for row in cells:
            for i, (column, cell) in enumerate(zip(columns, row, strict=False)):
                label = ("- " if i == 0 else "  ") + (f"{escape(column)}: " if column else "")
                console.print(label + cell.replace("\n", "\n    "), overflow="fold")
        if caption:
            console.print(caption, overflow="fold")
        return
    out = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for column, width in zip(columns, widths, strict=True):
        out.add_column(column, overflow="fold", justify=justify, width=width)
    for row in cells:
        out.add_row(*row)
    console.print(out)


def _fit(columns: Sequence[str], rows: list[list[str]], room: int) -> list[int] | None:
    """Column widths within ``room``, the widest narrowed first, never under a header's longest word."""
    lowest = [max([1, *map(len, column.split())]) for column in columns]
    if sum(lowest) > room:
        return None
    widths = [
        max(
            [len(column), 1]
            + [cell_len(line) for row in rows for line in Text.from_markup(row[i]).plain.splitlines()]
        )
        for i, column in enumerate(columns)
    ]
    while sum(widths) > room:
        widest = max(range(len(widths)), key=lambda i: (widths[i] > lowest[i], widths[i]))
        widths[widest] -= 1
    return widths


def _text(value: object) -> str:
    return "" if value is None else str(value)


def _size(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return _age(value) if value >= 90 else f"{value:.1f}s"


def _span(value: float | None) -> str:
    """Seconds, or ``-`` when not recorded."""
    if value is None:
        return "-"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"


def findings(items: list[Finding]) -> None:
    rows = [(f"[{_STYLE[f.level]}]{f.level.value}[/]", f.check, f.detail, f.hint) for f in items]
    table("lightning-resume doctor", ("", "check", "found", "what to do"), rows)


def removals(items: list[Removal], applied: bool) -> None:
    if not items:
        Console().print("lightning-resume gc: nothing to remove")
        return
    verb = "removed" if applied else "would remove (dry run; --apply to remove)"
    rows = ((r.kind, r.path, r.reason) for r in items)
    table(f"lightning-resume gc: {len(items)} file(s) {verb}", ("kind", "path", "why"), rows)


def root(report: dict[str, Any]) -> None:
    rows = [
        (
            r["run_id"],
            str(r["session_key"] or ""),
            str(r["status"]),
            _text(r["last_step"]),
            _age(r["age_seconds"]),
            "orphan" if r["orphan"] else ("indexed" if r["indexed"] else ""),
            r["path"],
        )
        for r in report["runs"]
    ]
    columns = ("run", "session key", "status", "step", "age", "index", "path")
    table(f"runs under {report['root']}", columns, rows)
    index = [(e["key"], str(e["target"]), e["state"]) for e in report["index"]]
    table("session index", ("key", "run dir", "state"), index)
    if report["handoff_files"]:
        Console().print(f"handoff files: {', '.join(report['handoff_files'])}")


def run(report: dict[str, Any]) -> None:
    console = Console()
    status = report["status"]
    console.print(f"run {report['run_id']}  ({report['path']})")
    entries = ", ".join(report["index_entries"]) or "none"
    console.print(f"session key: {report['session_key']}  index entries: {entries}")
    recorded = f"recorded at step {status.get('step')}, {status.get('time', '?')}"
    console.print(f"status: {status.get('status')} ({recorded})")
    load = report["next_restart_loads"]
    console.print(f"next restart loads: [bold]{load['checkpoint']}[/] — {load['why']}")
    rows = [
        (
            c["name"] + (f" -> {c['target']}" if c.get("target") else ""),
            _size(c["size"]),
            str(c["checksum"] or ""),
            _text(c["step"]),
            _text(c.get("world_size")),
            c["result"],
        )
        for c in report["checkpoints"]
    ]
    table("checkpoints", ("file", "bytes", "checksum", "step", "ranks", "verification"), rows)
    if directories := report.get("checkpoint_directories"):
        rows = [
            (
                ("-> " if d.get("current") else "") + d["name"],
                _size(d.get("size")),
                _text(d.get("step")),
                _text(d.get("world_size")),
                str(d.get("strategy") or ""),
                d["result"] + (f" ({d['reason']})" if d.get("reason") else ""),
            )
            for d in directories
        ]
        columns = ("directory", "bytes", "step", "ranks", "strategy", "verification")
        table("checkpoint directories (sharded; -> marks the one last.ckpt names)", columns, rows)
    if report["sidecars"]:
        identities = []
        for s in report["sidecars"]:  # an unreadable one has no identity, and the error instead
            shown = ", ".join(f"{k}={v}" for k, v in s["identity"].items() if v is not None)
            identities.append((s["tracker"], shown or s.get("error", "")))
        table("tracker sidecars (the runs a restart continues)", ("tracker", "identity"), identities)
    _attempts(console, report.get("attempts"))


def _attempts(console: Console, report: dict[str, Any] | None) -> None:
    """The attempt count, the crash-loop count and the last hangs of a run."""
    if not report or not report["count"]:
        return
    loop = report["crash_loop"]
    limit = f" (ProgressWatchdog stops at {loop['limit']})" if loop.get("limit") else ""
    console.print(
        f"attempts: {report['count']}; crash loop: {loop['attempts_without_progress']} in a row without a "
        f"new durable checkpoint{limit}"
    )
    if report["hangs"]:
        rows = [
            (
                str(h["attempt"]),
                h["section"],
                _text(h["step"]),
                "" if h["seconds"] is None else f"{h['seconds']:.0f} s (timeout {h['timeout']:.0f} s)",
                "\n".join(f"{layout.HANGS}/{Path(p).name}" for p in h["stacks"]),
            )
            for h in report["hangs"]
        ]
        table("last hangs", ("attempt", "section", "step", "no progress for", "stacks"), rows)
    if checked := [a for a in report["attempts"] if a.get("self_check")]:
        verdicts = [(str(a["attempt"]), _text(a.get("resumed_from")), a["self_check"]) for a in checked]
        table("resume self-checks", ("attempt", "resumed after step", "verdict"), verdicts)
    chosen = auto_cadence.choice_from_dict(report.get("cadence") or {})
    if chosen is not None:
        console.print(f"every_n_train_steps='auto' saves {chosen.describe()}")
    for line in report["endings"]:  # "attempt 3 ended: out of memory on rank 1, ..."
        print(line)


def _restore(row: RestartRow) -> str:
    """The load: its tier, MB and seconds (``fresh`` without one; ``-`` for what was not recorded)."""
    if row.resumed_from is None and row.restore_tier is None and row.restore_bytes is None:
        return "fresh"
    if row.restore_bytes is None:
        size = "-"
    else:
        mb = row.restore_bytes / 1e6
        size = f"{mb:.0f}" if mb >= 100 else f"{mb:.1f}" if mb >= 1 else f"{mb:.2f}"
    return f"{row.restore_tier or '-'} {size} MB {_span(row.restore_seconds)} s"


def restarts(rows: Sequence[RestartRow]) -> None:
    """The restarts broken down: one row per attempt after the first."""
    cells = (
        (
            str(r.attempt),
            *map(_span, (r.to_exit, r.relaunch, r.imports, r.setup)),
            _restore(r),
            _span(r.first_step),
            _span(r.total),
        )
        for r in rows
    )
    columns = ("#", "to exit", "relaunch", "imports", "setup", "restore", "1st step", "total")
    table("restarts broken down (seconds)", columns, cells, caption=RESTART_SPANS)


def goodput(found: GoodputReport) -> None:
    """``lightning-resume report``: the attempts, then the run's totals and goodput."""
    console = Console()
    if not found.attempts:
        console.print(f"{found.run_dir}: no attempts recorded (attempts.json is missing or empty)")
        return
    rows = [
        (
            str(r.attempt),
            f"+{_seconds(r.at)}" if r.at else "0",
            _seconds(r.wait_before),
            "fresh" if r.resumed_from is None else str(r.resumed_from),
            _seconds(r.restart_overhead),
            _text(r.last_step),
            r.how if r.cause in ("preempted", "failed", "running") else r.cause,
            (">=" if r.lost_at_least else "") + str(r.steps_lost),
            f"{_seconds(r.save_seconds)} ({r.saves})" if r.saves else "",
            _text(r.cadence_steps),
        )
        for r in found.attempts
    ]
    columns = ("#", "start", "wait", "from", "restart", "reached", "end", "lost", "saves", "auto N")
    table(f"attempts of {found.run_dir}", columns, rows)
    share = "n/a" if found.goodput is None else f"{found.goodput:.1%}"
    console.print(
        f"goodput {share}: {_seconds(found.useful_seconds)} of step compute kept in the final result (step "
        f"{found.final_step}) over {_seconds(found.wall_seconds)} of wall time"
    )
    console.print(USEFUL)
    console.print(
        f"lost: {found.steps_lost} steps; restart overhead {_seconds(found.restart_seconds)}, save stall "
        f"{_seconds(found.save_seconds)}, waiting between attempts {_seconds(found.wait_seconds)}"
    )
    if found.interruptions:
        console.print("interruptions: " + ", ".join(f"{n} {why}" for why, n in found.interruptions.items()))
    if found.cadence:
        console.print(
            f"every_n_train_steps='auto': every {found.cadence.get('steps')} steps, "
            f"{found.cadence.get('between_detail', '')}"
        )
    if found.earlier.get("attempts"):
        console.print(
            f"{found.earlier['attempts']} earlier attempt(s) are summed up in attempts.json and left out"
        )
    if found.restarts:
        restarts(found.restarts)
    if found.stragglers:
        stragglers(found.stragglers, console)


def stragglers(records: Sequence[dict[str, Any]], console: Console) -> None:
    """``StragglerDetector``'s section: every rank named, then the last record's ranks (ms per step)."""
    for record in records:
        for named in record.get("named") or []:
            found = Straggler.from_dict(named)
            console.print(f"attempt {record['attempt']}: straggler {found.describe()} (at step {found.step})")
    last = records[-1]
    ranks = list(last.get("ranks") or [])
    named_parts = {n.get("rank"): n.get("part") for r in records for n in r.get("named") or []}
    if len(ranks) > RANKS_SHOWN:  # the ranks named, then those that waited least: the suspects
        ranks.sort(key=lambda r: (r.get("rank") not in named_parts, r.get("collective") or 0.0))
        ranks = sorted(ranks[:RANKS_SHOWN], key=lambda r: r.get("rank", 0))
    parts = ("data", "compute", "optimizer", "collective")
    rows = (
        (
            str(r.get("rank")),
            _text(r.get("host")),
            *(milliseconds(r.get(part)).removesuffix(" ms") for part in parts),
            LABELS.get(named_parts.get(r.get("rank")) or "", ""),
        )
        for r in ranks
    )
    shown = "" if len(ranks) == len(last.get("ranks") or []) else f", {len(ranks)} of {len(last['ranks'])}"
    table(
        f"ranks of attempt {last['attempt']} (ms per step over {last.get('windows')} windows of "
        f"{last.get('window')} steps{shown})",
        ("rank", "node", *(LABELS[part] for part in parts), "straggler"),
        rows,
        caption="a straggler's own part is slow and it waits least in collectives: the others wait for it",
        console=console,
    )
