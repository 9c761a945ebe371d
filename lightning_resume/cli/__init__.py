"""The ``lightning-resume`` command line (also ``python -m lightning_resume``): a :class:`Command` per
subcommand in :data:`COMMANDS`; what a subcommand needs is imported only when it runs (a fast ``--help``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

from lightning_resume._version import __version__

PROG = "lightning-resume"
USAGE_ERROR = 2
INTERRUPTED = 130


class UsageError(Exception):
    """Bad command-line input: reported as one line on stderr with exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see --help)")


@dataclass(frozen=True)
class Command:
    """A subcommand: its line in ``lightning-resume --help``, its own ``--help`` text, and its functions."""

    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]  # declares its arguments on its parser
    run: Callable[[argparse.Namespace], int]  # returns the exit status; raises UsageError for bad input


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number >= 1, got 0")
    return value


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


#: The points ``check`` interrupts a run at (lightning_resume.cli.check.POINTS; listed here for --help).
_POINTS = "mid-epoch, after-epoch-save, in-validation, in-save, after-restart, sigterm"


def _add_check_options(parser: argparse.ArgumentParser) -> None:
    steps_help = "stop every run after N optimizer steps (default: two epochs or 200 steps, the fewer)"
    parser.add_argument("--steps", type=_positive_int, metavar="N", help=steps_help)
    every_help = "RequeueCheckpoint saves every N steps during the check (default: an eighth of the steps)"
    parser.add_argument("--every", type=_positive_int, metavar="N", help=every_help)
    points_help = f"comma-separated points to interrupt a run at: {_POINTS} (default: all)"
    parser.add_argument("--points", type=_names, help=points_help)
    kills_help = "also run a scenario killed at K random steps, relaunched after each (default: 0)"
    parser.add_argument("--kills", type=_non_negative_int, default=0, metavar="K", help=kills_help)
    parser.add_argument("--seed", type=_non_negative_int, help="seed for the random kills (default: random)")
    timeout_help = "seconds an attempt may take (default: 5x the first run, at least 120)"
    parser.add_argument("--timeout", type=_positive_int, metavar="SECONDS", help=timeout_help)
    workdir_help = "where the check's folder is made (default: the temporary directory)"
    parser.add_argument("--workdir", type=Path, metavar="DIR", help=workdir_help)
    parser.add_argument("--keep", action="store_true", help="keep the check's folder: runs, logs, timelines")
    parser.add_argument("--json", action="store_true", help="print a JSON report for CI instead of a table")


def _add_check_arguments(parser: argparse.ArgumentParser) -> None:
    _add_check_options(parser)
    command_help = "the training command as you launch it, after -- (e.g. -- python train.py fit -c cfg.yaml)"
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help=command_help)


def _check(args: argparse.Namespace, command: list[str], project: Path | None) -> int:
    from lightning_resume.cli.check import POINTS, CheckError, Options, check

    options = Options(
        command, args.steps, args.every, args.points or list(POINTS), args.kills, args.seed,
        args.timeout, args.workdir, args.keep, args.json,
    )  # fmt: skip
    try:
        return check(options, project)
    except CheckError as e:
        raise UsageError(f"{PROG} {args.command}: {e}") from None


def _run_check(args: argparse.Namespace) -> int:
    return _check(args, args.argv[1:] if args.argv[:1] == ["--"] else args.argv, Path.cwd())


def _run_demo(args: argparse.Namespace) -> int:
    return _check(args, [sys.executable, "-m", "lightning_resume.cli.demo"], None)


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")


def _add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    root_help = "the runs root to check (default: runs)"
    parser.add_argument("--root", type=Path, default=Path("runs"), help=root_help)
    write_help = "MiB written and fsynced to time durable writes to the root; 0 skips it (default: 64)"
    parser.add_argument("--write-test", type=_non_negative_int, default=64, metavar="MIB", help=write_help)
    emit_help = "print the scheduler's configuration for the failure classes' exit statuses instead"
    parser.add_argument("--emit", choices=("slurm", "skypilot", "kubernetes", "torchrun"), help=emit_help)
    _add_json(parser)


def _run_doctor(args: argparse.Namespace) -> int:
    from lightning_resume.cli import doctor, emit, render

    if args.emit:
        print(emit.EMITTERS[args.emit](), end="")
        return 0
    findings = doctor.run_checks(args.root.expanduser().resolve(), os.environ, args.write_test << 20)
    if args.json:
        print(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        render.findings(findings)
    return 1 if any(f.level is doctor.Level.ERROR for f in findings) else 0


def _add_gc_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", type=Path, metavar="ROOT", help="the runs root (the RunDir root)")
    parser.add_argument("--older-than", default="30d", metavar="AGE", help="e.g. 30d, 12h (default: 30d)")
    parser.add_argument("--apply", action="store_true", help="remove the files (default: only list them)")
    _add_json(parser)


def _run_gc(args: argparse.Namespace) -> int:
    from lightning_resume.cli import gc, render
    from lightning_resume.run_dir import layout

    try:
        age = gc.parse_age(args.older_than)
    except ValueError as e:
        raise UsageError(f"{PROG} gc: {e}") from None
    root = args.root.expanduser()
    if not root.is_dir():
        raise UsageError(f"{PROG} gc: {str(root)!r} is not a directory")
    if not layout.is_root(root):
        raise UsageError(f"{PROG} gc: {str(root)!r} is not a runs root (no run dirs or .index/ inside)")
    removals = gc.plan(root, age)
    removals, failed = gc.apply(removals) if args.apply else (removals, [])
    if args.json:
        failures = [{**asdict(r), "error": why} for r, why in failed]
        report = {"applied": args.apply, "removals": [asdict(r) for r in removals], "failed": failures}
        print(json.dumps(report, indent=2))
    else:
        render.removals(removals, args.apply)
        for removal, why in failed:
            print(f"{PROG} gc: could not remove {removal.path}: {why}", file=sys.stderr)
    return 1 if failed else 0


def _add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, metavar="PATH", help="a runs root (RunDir's root) or one run dir")
    _add_json(parser)


def _run_inspect(args: argparse.Namespace) -> int:
    from lightning_resume.cli import inspect, render
    from lightning_resume.run_dir import layout

    path = args.path.expanduser().resolve()
    if not path.exists():
        raise UsageError(f"{PROG} inspect: {str(args.path)!r} does not exist")
    if layout.is_run_dir(path):
        kind, report, draw = "run", inspect.describe_run(path), render.run
    elif layout.is_root(path):
        kind, report, draw = "root", inspect.describe_root(path), render.root
    else:
        what = "is neither a run dir (run_meta.json) nor a runs root"
        raise UsageError(f"{PROG} inspect: {str(args.path)!r} {what}")
    if args.json:
        print(json.dumps({"kind": kind, **report}, indent=2, default=str))
    else:
        draw(report)
    return 0


def _add_run_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run dir (it holds run_meta.json)")


def _run_dir(args: argparse.Namespace, command: str) -> Path:
    from lightning_resume.run_dir import layout

    run_dir = args.run_dir.expanduser().resolve()
    if not layout.is_run_dir(run_dir):
        raise UsageError(f"{PROG} {command}: {str(args.run_dir)!r} is not a run dir (no run_meta.json)")
    return run_dir


def _add_report_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_dir(parser)
    plot_help = "also draw the timeline as a PNG at this path (needs matplotlib)"
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help=plot_help)
    _add_json(parser)


def _run_report(args: argparse.Namespace) -> int:
    from lightning_resume.cli import render, report

    run_dir = _run_dir(args, "report")
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        what = f"--plot writes a PNG: give a path ending in .png, got {str(args.plot)!r}"
        raise UsageError(f"{PROG} report: {what}")
    found = report.report(run_dir)
    if args.json:
        print(json.dumps(asdict(found), indent=2))
    else:
        render.goodput(found)
    if args.plot is not None:
        try:
            path = report.plot(found, args.plot.expanduser())
        except ImportError as e:
            raise UsageError(f"{PROG} report: {e}") from None
        except OSError as e:
            print(f"{PROG} report: could not write {args.plot}: {e}", file=sys.stderr)
            return 1
        print(f"timeline: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _run_reset_crash_loop(args: argparse.Namespace) -> int:
    from lightning_resume.run_dir import attempts, layout
    from lightning_resume.watchdog import crash_loop

    run_dir = _run_dir(args, "reset-crash-loop")
    history = attempts.read(run_dir)
    streak = crash_loop.without_progress(history)
    try:
        attempts.write(run_dir, crash_loop.reset(history))
    except OSError as e:
        print(f"{PROG} reset-crash-loop: could not write {run_dir / layout.ATTEMPTS}: {e}", file=sys.stderr)
        return 1
    print(
        f"{run_dir}: crash-loop count reset (it was {len(streak)} attempt(s) in a row without a new durable "
        "checkpoint); the next attempt trains"
    )
    return 0


COMMANDS: dict[str, Command] = {
    "check": Command(
        "check that your training command resumes exactly: kill it at chosen points, compare",
        "Run the command twice uninterrupted (it must be reproducible), then once per point, killed there "
        "(SIGKILL to its process group, or SIGTERM) and relaunched until it finishes, as a scheduler "
        "would; compare the final weights and optimizer state bitwise, the batches, losses and weights "
        "of every step, what each logger recorded, the run dir and logger versions, and the resume "
        "self-checks. The project needs RunDir and RequeueCheckpoint; runs are short (--steps), in a "
        "folder of the check's own, with trackers offline. Exit status 0 only if every scenario is exact.",
        _add_check_arguments,
        _run_check,
    ),
    "demo": Command(
        "run check on a small bundled example",
        "`lightning-resume check` on a small example project that ships with the package (a shuffled "
        "DataLoader, dropout, a learning-rate schedule, a CSV logger, EarlyStopping): every point, and "
        "--kills K random kills. Exit status 0 if every scenario is exact.",
        _add_check_options,
        _run_demo,
    ),
    "inspect": Command(
        "show a runs root or one run: what the next restart will load, and why",
        "For a runs root: its runs (session key, status, last step, age), the session index entries "
        "(stale ones marked), orphans and handoff files. For one run dir: which checkpoint the next "
        "restart loads and why, every checkpoint with its verification (size, checksum, step), the "
        "sharded checkpoint directories (step, ranks, strategy, verification) and leftovers of "
        "interrupted saves, the index entries pointing at it and the tracker sidecars with the runs "
        "they will resume.",
        _add_inspect_arguments,
        _run_inspect,
    ),
    "doctor": Command(
        "check this environment the way a failed requeue would be debugged",
        "Check the scheduler and its ids, the session key, submitit's preempt signal, scontrol, signal "
        "handlers, $TMPDIR and free space against the run root, the durable write speed of the run "
        "root (and how long the largest checkpoint takes to write), whether a save of the newest "
        "checkpoint fits in each grace window (stop signal to SIGKILL) of SLURM, torchrun or Kubernetes "
        "or in $LIGHTNING_RESUME_GRACE_SECONDS, and tracker settings that would send data somewhere "
        "unexpected. Each finding is ok, warn or error with what to do; exit status 1 if any is an "
        "error. --emit SCHEDULER prints instead what SLURM, SkyPilot, Kubernetes or torchrun must be "
        "told to retry the failure classes a retry can fix and stop on the others.",
        _add_doctor_arguments,
        _run_doctor,
    ),
    "report": Command(
        "show a run's attempts on a timeline, what each interruption cost, and its goodput",
        "From the run dir's attempts.json: each attempt's start, the step it resumed from, how it ended "
        "(preempted by a signal or a notice, killed, hung, crashed, finished), the steps it lost, its "
        "restart overhead (start to first step) and save overhead, and the run's goodput: the time of "
        "the steps that are part of the final result over the wall time. --plot FILE.png also draws the "
        "timeline (matplotlib).",
        _add_report_arguments,
        _run_report,
    ),
    "reset-crash-loop": Command(
        "let the next attempt of a run stopped by ProgressWatchdog's crash-loop rule train again",
        "ProgressWatchdog stops an attempt before training when the run's last attempts all ended "
        "failed, hung or killed without a new durable checkpoint (exit status 93). Once the cause is "
        "fixed, this resets the count in the run dir's attempts.json, so that the next attempt trains; "
        "the attempts stay in the history.",
        _add_run_dir,
        _run_reset_crash_loop,
    ),
    "gc": Command(
        "remove index entries of long-finished runs, stale handoff files and save leftovers",
        "List (or with --apply remove) session index entries of runs that finished longer ago than "
        "--older-than, entries pointing at deleted run dirs, old rank handoff files, and leftovers of "
        "interrupted sharded saves that old (save directories, checkpoint directories without a "
        "readable manifest that last.ckpt does not name). Runs that are running, preempted, failed or "
        "of unknown status keep their entries. Run dirs and committed checkpoints are never deleted.",
        _add_gc_arguments,
        _run_gc,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The parser for every subcommand in :data:`COMMANDS`."""
    parser = _Parser(prog=PROG, description="Make PyTorch Lightning training survive preemption.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for name, command in COMMANDS.items():
        sub = subparsers.add_parser(name, help=command.help, description=command.description)
        command.add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return the exit status.

    Args:
        argv: The arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        The subcommand's exit status; 2 for bad input (one line on stderr), 130 on Ctrl-C.
    """
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help and --version print and exit 0
            return e.code if isinstance(e.code, int) else 0
        return COMMANDS[args.command].run(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
