"""Every table of ``lightning-resume`` is printed whole when stdout is not a terminal (a CI log, ``| tee``):
at 80 columns its columns narrow, headers wrap between words and cells fold, and a table that cannot fit
even so is printed as one block of lines per row; nothing is cropped."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import job_env, run_job
from rich.console import Console

from lightning_resume.cli import render

SCRIPT = str(Path(sys.executable).parent / "lightning-resume")
#: A table line's first character and the last it must end with (a cropped line loses it).
BORDERS = {"┏": "┓", "┃": "┃", "┡": "┩", "│": "│", "└": "┘"}


def problems(text: str, width: int = 80) -> list[str]:
    """Lines wider than ``width``, and table lines cut before their right border."""
    found = []
    for line in text.splitlines():
        line = line.rstrip()
        if len(line) > width:
            found.append(f"{len(line)} columns: {line!r}")
        elif line[:1] in BORDERS and not line.endswith(BORDERS[line[0]]):
            found.append(f"cropped: {line!r}")
    return found


def words(text: str) -> set[str]:
    return set(re.sub("[┏┓┃┡┩│└┘━─┳╇┴]", " ", text).split())


def piped(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The console script at 80 columns, its stdout a pipe (not a terminal)."""
    return subprocess.run(
        [SCRIPT, *map(str, args)],
        env=job_env(COLUMNS="80", WANDB_MODE="online", SWANLAB_MODE="offline"),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A runs root with one run, SIGKILLed at step 5 and restarted to the end (CSV logs)."""
    root = tmp_path_factory.mktemp("tables") / "root"
    killed = run_job(root, root.parent / "a.pt", "--csv", "--kill-at", "5", SLURM_JOB_ID="4711")
    assert killed.returncode == -9, killed.output
    again = run_job(root, root.parent / "a.pt", "--csv", SLURM_JOB_ID="4711", SLURM_RESTART_COUNT="1")
    assert again.returncode == 0 and again.run_dir is not None, again.output
    return root, again.run_dir


def test_every_command_prints_whole_tables_at_80_columns_through_a_pipe(runs: tuple[Path, Path]) -> None:
    root, run_dir = runs
    # Each command, and words of its tables' last columns (cut first when a table is cropped).
    commands: list[tuple[tuple[str | Path, ...], set[str]]] = [
        (("doctor", "--root", root, "--write-test", "0"), {"what", "do", "WANDB_MODE"}),
        (("gc", root, "--older-than", "0s"), {"why", "finished"}),
        (("inspect", root), {"index", "path", "state", "ok"}),
        (("inspect", run_dir), {"verification", "loads", "identity", "version=0"}),
        (("report", run_dir), {"saves", "auto", "total", "restore"}),
    ]
    for args, expected in commands:
        out = piped(*args)
        assert out.returncode in (0, 1), out.stderr
        assert not problems(out.stdout), f"{args}: " + "\n".join(problems(out.stdout)) + "\n" + out.stdout
        assert expected <= words(out.stdout), f"{args}: {expected - words(out.stdout)} missing:\n{out.stdout}"


CHECK = ("scenario", "interruptions", "result", "first difference", "self-check", "steps lost")


def printed(columns: tuple[str, ...], rows: list[tuple[str, ...]], caption: str | None = None) -> str:
    out = io.StringIO()
    render.table("title", columns, rows, caption=caption, console=Console(file=out, width=80))
    return out.getvalue()


def test_the_check_table_narrows_its_columns_and_keeps_every_cell() -> None:
    rows = [
        (
            "mid-epoch",
            "SIGKILL at step 7 (epoch 1, batch 3)",
            "NOT exact",
            "weights differ at step 12",
            "exact",
            "3",
        ),
        ("sigterm", "SIGTERM at step 5", "exact", "-", "unchecked", "0"),
    ]
    text = printed(CHECK, rows)
    assert not problems(text), "\n".join(problems(text))
    assert text.count("┃") > 7  # a table, its headers wrapped between words
    assert words(" ".join(CHECK)) | words(" ".join(" ".join(row) for row in rows)) <= words(text)


def test_a_table_too_wide_for_80_columns_prints_one_block_per_row() -> None:
    columns = tuple(f"column {n}" for n in range(12))
    rows = [tuple(f"value{n}-{r} [green]ok[/]" for n in range(12)) for r in range(2)]
    text = printed(columns, rows, caption="what the columns mean " * 6)
    assert not problems(text), "\n".join(problems(text))
    lines = text.splitlines()
    assert lines[1:3] == ["- column 0: value0-0 ok", "  column 1: value1-0 ok"]
    assert {f"value{n}-{r}" for n in range(12) for r in range(2)} <= words(text)
    assert " ".join(text.split()).endswith(("what the columns mean " * 6).strip())
