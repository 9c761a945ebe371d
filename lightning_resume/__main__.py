"""The ``lightning-resume`` command line (also ``python -m lightning_resume``).

Each subcommand is a :class:`Command` in :data:`COMMANDS`: a function that declares its arguments
and a function that runs it and returns the exit status. Modules a subcommand needs are imported
only when it runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from lightning_resume._version import __version__

PROG = "lightning-resume"
USAGE_ERROR = 2
INTERRUPTED = 130


class UsageError(Exception):
    """Bad command-line input: reported as one line on stderr with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that raises :class:`UsageError` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see --help)")


@dataclass(frozen=True)
class Command:
    """A subcommand.

    Attributes:
        help: One line for ``lightning-resume --help``.
        description: The subcommand's ``--help`` text.
        add_arguments: Declares the subcommand's arguments on its parser.
        run: Runs the subcommand with the parsed arguments and returns the exit status; raises
            :class:`UsageError` for input it rejects.
    """

    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def _add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preemptions",
        type=_non_negative_int,
        default=3,
        metavar="N",
        help="how many times to kill the run (default: 3)",
    )
    parser.add_argument(
        "--seed",
        type=_non_negative_int,
        default=None,
        help="seed for choosing the kill steps (default: random)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        metavar="DIR",
        help="empty or new directory for runs, weights and logs, kept afterwards (default: a temporary "
        "directory, deleted at the end)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")


def _run_demo(args: argparse.Namespace) -> int:
    from lightning_resume._demo import DemoError, run_demo

    try:
        return run_demo(preemptions=args.preemptions, seed=args.seed, workdir=args.workdir, keep=args.keep)
    except DemoError as e:
        raise UsageError(f"{PROG} demo: {e}") from None


COMMANDS: dict[str, Command] = {
    "demo": Command(
        help="preempt a small training job a few times and check it resumes exactly",
        description=(
            "Train a small job without interruption, then again while SIGKILLing it at random steps and "
            "restarting it like a SLURM requeue; show where each attempt resumed and whether the final "
            "weights are bitwise equal. Exit status 0 if they are, 1 if not."
        ),
        add_arguments=_add_demo_arguments,
        run=_run_demo,
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
