"""``lightning-resume report``'s straggler section, from an ``attempts.json`` of a large job: the stragglers
of every attempt, and the last attempt's ranks (past 32: the ranks named, then those that waited least)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_resume.cli import main
from lightning_resume.run_dir import attempts, layout
from lightning_resume.run_dir.attempts import Attempt, Cause, End, History
from lightning_resume.straggler.decision import Straggler


def record(ranks: int, named: list[Straggler], slow_waits: dict[int, float]) -> dict[str, object]:
    rows = [
        {
            "rank": r,
            "host": f"gpu-{r // 8:03d}",
            "data": 0.01,
            "compute": 0.2,
            "optimizer": 0.01,
            "collective": slow_waits.get(r, 0.15),
        }
        for r in range(ranks)
    ]
    return {"window": 100, "windows": 7, "ranks": rows, "named": [s.to_dict() for s in named]}


def test_the_report_names_every_straggler_and_shows_the_suspects_of_a_large_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = Straggler(3, "gpu-000", "data", 0.15, 0.01, 2, 200, 0.002, 0.15)
    second = Straggler(37, "gpu-004", "compute", 0.45, 0.2, 2, 900, 0.001, 0.15)
    history = History(
        attempts=(
            Attempt(
                1,
                "n",
                1,
                None,
                1000.0,
                first_step=1010.0,
                last_step=500,
                last_step_time=1500.0,
                end=End(1501.0, Cause.KILLED, "killed"),
                stragglers=record(8, [first], {3: 0.002}),
            ),
            Attempt(
                2,
                "n",
                2,
                None,
                1600.0,
                resumed_from=400,
                first_step=1610.0,
                last_step=1000,
                last_step_time=2500.0,
                end=End(2501.0, Cause.FINISHED, "finished"),
                stragglers=record(40, [second], {37: 0.001, 12: 0.05}),
            ),
        )
    )
    (tmp_path / layout.RUN_META).write_text(json.dumps({"run_id": "r"}))
    attempts.write(tmp_path, history)
    assert attempts.read(tmp_path).attempts[1].stragglers == history.attempts[1].stragglers
    monkeypatch.setenv("COLUMNS", "120")  # one line per rank
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    first_cells = [line.split("│")[1].strip() for line in printed.splitlines() if line.startswith("│")]
    shown = {int(cell) for cell in first_cells if cell.isdigit()}
    assert len(shown) == 32 and {37, 12} <= shown and 39 not in shown  # named, then who waited least
    out = " ".join(printed.split())
    assert "attempt 1: straggler rank 3 on node gpu-000: data wait 150 ms per step vs median 10 ms" in out
    assert "attempt 2: straggler rank 37 on node gpu-004: compute 450 ms per step vs median 200 ms" in out
    assert "ranks of attempt 2 (ms per step over 7 windows of 100 steps, 32 of 40)" in out
    assert main(["report", str(tmp_path), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [r["attempt"] for r in found["stragglers"]] == [1, 2]
