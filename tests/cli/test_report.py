"""``lightning-resume report``: a real run killed, SIGTERM'd, stopped by a notice and finished, read back
against what the test did, as text, as JSON and as a PNG timeline."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import JOB_MODULE, job_env, run_job, same_weights

from lightning_resume.cli import main, report
from lightning_resume.cli.report import AttemptRow, bar

PNG = b"\x89PNG\r\n\x1a\n"


def test_report_reads_back_a_run_with_every_kind_of_ending(
    tmp_path: Path,
    baseline: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, out, flag = tmp_path / "runs", tmp_path / "out.pt", tmp_path / "preempted"
    common = ("--key", "mixed", "--every", "4", "--preemption", "--notice", f"file={flag}")
    killed = run_job(root, out, *common, "--kill-at", 7)  # last save at step 4
    assert killed.returncode == -9, killed.output[-3000:]
    signalled = run_job(root, out, *common, "--signal-at", 14)  # saved at step 15, where it stops
    assert signalled.returncode == 143, signalled.output[-3000:]
    noticed = run_job(root, out, *common, "--on-notice", "stop", "--announce-at", 20, "--announce-file", flag)
    assert noticed.returncode == 143, noticed.output[-3000:]
    stop = re.search(r"Preempted by the file notice at step (\d+)", noticed.output)
    assert stop is not None, noticed.output[-3000:]
    flag.unlink()
    finished = run_job(root, out, *common)
    assert finished.returncode == 0 and finished.run_dir is not None, finished.output[-3000:]
    assert same_weights(out, baseline["stateful"])
    noticed_at = int(stop.group(1))

    plot = tmp_path / "timeline.png"
    assert main(["report", str(finished.run_dir), "--json", "--plot", str(plot)]) == 0
    found = json.loads(capsys.readouterr().out)
    rows = [AttemptRow(**row) for row in found["attempts"]]
    assert [(r.cause, r.how) for r in rows] == [
        ("killed", "killed (no grace: SIGKILL, OOM, node loss)"),
        ("preempted", "SIGTERM"),
        ("preempted", "file notice"),
        ("finished", "finished"),
    ]
    assert [r.resumed_from for r in rows] == [None, 4, 15, noticed_at]
    assert [r.last_step for r in rows] == [6, 15, noticed_at, 36]  # the killer acts before RunDir at 7
    assert [r.steps_lost for r in rows] == [2, 0, 0, 0] and not rows[0].lost_at_least
    assert [r.steps_kept for r in rows] == [4, 11, noticed_at - 15, 36 - noticed_at]
    assert all(r.restart_overhead is not None and r.restart_overhead > 0 for r in rows)
    assert all(r.wait_before is not None and r.wait_before >= 0 for r in rows[1:])
    assert all(r.saves > 0 and r.save_seconds > 0 for r in rows)
    assert found["final_step"] == 36 and found["steps_lost"] == 2
    assert 0 < found["goodput"] < 1
    assert found["useful_seconds"] == pytest.approx(sum(r.useful_seconds for r in rows))
    assert found["interruptions"] == {"killed": 1, "preempted (SIGTERM)": 1, "preempted (file notice)": 1}
    assert plot.read_bytes()[:8] == PNG and plot.stat().st_size > 10_000

    # The picture's green is the headline's useful time; each bar's training parts follow one another.
    useful = [seconds for r in rows for part, _, seconds in bar(r) if part == "useful"]
    assert sum(useful) == pytest.approx(found["useful_seconds"])
    for row in rows:
        parts = bar(row)
        assert all(a + n == pytest.approx(b) for (_, a, n), (_, b, _) in itertools.pairwise(parts))

    monkeypatch.setenv("COLUMNS", "80")  # a terminal of 80 columns: no header folded mid-word
    assert main(["report", str(finished.run_dir)]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    header = next(line for line in out.splitlines() if "restart" in line)
    assert all(word in header for word in ("start", "wait", "from", "restart", "reached", "lost", "saves"))
    text = " ".join(out.split())
    assert f"goodput {found['goodput']:.1%}" in text and "useful: the compute time of the steps" in text
    assert "lost: 2 steps" in text and "1 killed, 1 preempted (SIGTERM), 1 preempted (file notice)" in text


def test_a_requeue_killed_while_importing_counts_from_the_gap_in_the_restart_count(
    tmp_path: Path, baseline: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Launch r0 dies before RunDir exists: no record, but r1 sees the restart count and the report and
    the ``"auto"`` interval count it (tests/last_ckpt/test_cadence.py counts gaps between two records)."""
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    common = ("--key", "gap", "--every", "auto")

    def scheduler(count: int) -> dict[str, str | int | None]:
        return {"TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": count or None}

    starting = subprocess.Popen(
        [sys.executable, "-m", JOB_MODULE, "--root", str(root), "--out", str(out), *common],
        env=job_env(**scheduler(0)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        starting.wait(0.3)  # still importing torch
    except subprocess.TimeoutExpired:
        starting.kill()
    assert starting.wait() == -9
    finished = run_job(root, out, *common, **scheduler(1))
    assert finished.returncode == 0 and finished.run_dir is not None, finished.output[-3000:]
    assert same_weights(out, baseline["stateful"])

    assert main(["report", str(finished.run_dir), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [(row["attempt"], row["unrecorded_before"]) for row in found["attempts"]] == [(1, 1)]
    assert found["interruptions"] == {report.UNRECORDED: 1}
    (recorded,) = json.loads((finished.run_dir / "attempts.json").read_text())["attempts"]
    assert recorded["launch"] == "elastic-job7-r1" and recorded["unrecorded_launches"] == 1
    assert "1 interruption(s)" in recorded["cadence"]["between_detail"]
    assert "1 killed while starting" in recorded["cadence"]["between_detail"]


def test_report_refuses_what_is_not_a_run_dir_or_a_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "is not a run dir (no run_meta.json)" in capsys.readouterr().err
    (tmp_path / "run_meta.json").write_text("{}")
    assert main(["report", str(tmp_path), "--plot", str(tmp_path / "t.svg")]) == 2
    assert "--plot writes a PNG" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 0  # no attempts.json yet: said so
    assert "no attempts recorded" in " ".join(capsys.readouterr().out.split())
    assert report.report(tmp_path).goodput is None
