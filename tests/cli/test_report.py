"""``lightning-resume report``: a real run killed, SIGTERM'd, stopped by a notice and finished, read back
against what the test did, as text, as JSON and as a PNG timeline."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import JOB_MODULE, job_env, run_job, same_weights

from lightning_resume.cli import main, report
from lightning_resume.cli.report import AttemptRow, RestartRow, bar
from lightning_resume.run_dir import attempts
from lightning_resume.run_dir.attempts import Attempt, Cause, End, History

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.long
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

    # Each restart broken down. Lightning's own checkpoint IO tells no tier and no load time: the bytes
    # are last.ckpt's, the load's end is when the state reached the callbacks.
    restarts = [RestartRow(**row) for row in found["restarts"]]
    assert [(r.attempt, r.after, r.resumed_from) for r in restarts] == [
        (2, "killed", 4),
        (3, "preempted", 15),
        (4, "preempted", noticed_at),
    ]
    killed, *stopped = restarts
    assert killed.to_exit is None and killed.relaunch is None  # a SIGKILL leaves no exit time
    for r in stopped:  # the signal (or the ranks' decision) -> save -> exit -> the next launch
        assert r.to_exit is not None and r.to_exit > 0 and r.relaunch is not None
    for r in restarts:
        assert r.restore_tier is None and r.restore_seconds is None and r.setup is None
        assert r.restore_bytes is not None and r.restore_bytes > 0
        assert r.imports is not None and r.imports > 0 and r.first_step is not None and r.first_step > 0
        assert r.total is not None and r.total > r.imports + r.first_step

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


def test_a_restart_through_durable_checkpoint_io_shows_its_tier_bytes_and_every_span(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    common = ("--key", "durable", "--every", 4, "--durable", "--preemption", "--epochs", 2, "--sanity", 0)
    signalled = run_job(root, out, *common, "--signal-at", 14)  # saved at step 15, where it stops
    assert signalled.returncode == 143, signalled.output[-3000:]
    finished = run_job(root, out, *common)
    assert finished.returncode == 0 and finished.run_dir is not None, finished.output[-3000:]

    assert main(["report", str(finished.run_dir), "--json"]) == 0
    (row,) = [RestartRow(**r) for r in json.loads(capsys.readouterr().out)["restarts"]]
    assert (row.attempt, row.after, row.resumed_from, row.restore_tier) == (2, "preempted", 15, "durable")
    first, second = attempts.read(finished.run_dir).attempts
    assert second.restore is not None and second.restore["step"] == 15
    assert Path(second.restore["path"]).name == "last.ckpt"
    assert row.restore_bytes == second.restore["bytes"] > 0
    spans = [row.to_exit, row.relaunch, row.imports, row.setup, row.restore_seconds, row.first_step]
    assert all(span is not None for span in spans), row
    timed = (row.to_exit, row.imports, row.setup, row.restore_seconds, row.first_step)  # not relaunch: 2 pids
    assert all(span > 0 for span in timed), row  # type: ignore[operator]
    # The spans follow one another: they add up to the fault -> first step (the file keeps milliseconds).
    assert sum(spans) == pytest.approx(row.total, abs=0.005)  # type: ignore[arg-type]
    assert first.end is not None and first.end.signalled is not None and first.exited is not None
    assert first.end.signalled < first.end.time < first.exited  # the signal, the stop after the save, exit

    assert main(["report", str(finished.run_dir)]) == 0
    table = capsys.readouterr().out
    assert "restarts broken down (seconds)" in table and "durable" in table


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


def restarted(number: int, started: float, **fields: object) -> Attempt:
    return Attempt(number, "node", number, None, started, **fields)  # type: ignore[arg-type]


#: A run preempted by SIGTERM (at 1090, save and exit by 1104), restored from the durable tier, killed
#: (last step beat 1200), restored from a checkpoint IO that does not tell its tier or time, hung
#: (no progress from 1300 on, noticed at 1330), started again from scratch.
BROKEN_DOWN = History(
    attempts=(
        restarted(
            1,
            1000.0,
            code_started=1003.0,
            first_step=1010.0,
            end=End(1100.0, Cause.PREEMPTED, "preempted by SIGTERM", signal="SIGTERM", signalled=1090.0),
            exited=1104.0,
        ),
        restarted(
            2,
            1130.0,
            code_started=1133.5,
            resumed_from=15,
            restore={
                "tier": "durable",
                "path": "last.ckpt",
                "bytes": 5_000_000,
                "seconds": 1.5,
                "started": 1140.0,
            },
            restored_at=1141.5,
            first_step=1144.0,
            end=End(1200.0, Cause.KILLED, "killed after step 20 (no word from it)", step=20),
        ),
        restarted(
            3,
            1260.0,
            code_started=1262.0,
            resumed_from=20,
            restore={"tier": None, "path": "last.ckpt", "bytes": 4_000_000, "seconds": None},
            restored_at=1270.0,
            first_step=1275.0,
            end=End(1330.0, Cause.HUNG, "hung in training step at step 22", seconds=30.0, step=22),
        ),
        restarted(4, 1400.0, code_started=1401.0, first_step=1402.0),
    )
)


def test_each_restart_is_broken_down_from_the_fault_to_its_first_step_unknown_left_unknown() -> None:
    rows = report.build(BROKEN_DOWN).restarts
    assert rows == [
        RestartRow(2, "preempted", 14.0, 26.0, 3.5, 6.5, 15, "durable", 5_000_000, 1.5, 2.5, 54.0),
        RestartRow(3, "killed", None, None, 2.0, None, 20, None, 4_000_000, None, 5.0, 75.0),
        RestartRow(4, "hung", None, None, 1.0, None, None, None, None, None, None, 102.0),
    ]
    preempted = rows[0]  # every span known: they add up to the total
    spans = (preempted.to_exit, preempted.relaunch, preempted.imports, preempted.setup)
    assert sum(spans) + 1.5 + 2.5 == preempted.total  # type: ignore[arg-type]

    # A file written before these fields: the restart's total only, nothing invented.
    old = History(
        tuple(
            Attempt(a.number, a.host, a.pid, None, a.started, first_step=a.first_step, end=a.end)
            for a in BROKEN_DOWN.attempts[:2]
        )
    )
    (row,) = report.build(old).restarts
    assert (row.to_exit, row.relaunch, row.imports, row.setup, row.first_step) == (None,) * 5
    assert (row.restore_tier, row.restore_bytes, row.restore_seconds, row.total) == (None, None, None, 54.0)

    # Without /proc the process start is not known (``started`` is when fit began, after RunDir).
    unmeasured = replace(BROKEN_DOWN.attempts[1], started=1135.0)
    row = report.build(History((BROKEN_DOWN.attempts[0], unmeasured))).restarts[0]
    assert (row.relaunch, row.imports, row.setup, row.total) == (None, None, 6.5, 54.0)


def test_the_restarts_table_shows_unknown_as_a_dash_in_80_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "run_meta.json").write_text("{}")
    attempts.write(tmp_path, BROKEN_DOWN)
    assert main(["report", str(tmp_path), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [RestartRow(**row) for row in found["restarts"]] == report.build(BROKEN_DOWN).restarts

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    lines = out[out.index("restarts broken down (seconds)") :].splitlines()
    header = next(line for line in lines if "relaunch" in line)
    assert all(
        word in header for word in ("#", "to exit", "imports", "setup", "restore", "1st step", "total")
    )
    cells = [[cell.strip() for cell in line.strip("│").split("│")] for line in lines if line.startswith("│")]
    rows = [cell for cell in cells if cell[0]]  # a row's first line (a long restore cell wraps)
    assert [cell[:5] + cell[6:] for cell in rows] == [
        ["2", "14.0", "26.0", "3.50", "6.50", "2.50", "54.0"],
        ["3", "-", "-", "2.00", "-", "5.00", "75.0"],
        ["4", "-", "-", "1.00", "-", "-", "102.0"],
    ]
    text = " ".join(out.split())
    assert "-: not recorded" in text
    restores = " ".join(" ".join(cell[5] for cell in cells).split())  # the restore cells, wraps joined
    assert restores == "durable 5.0 MB 1.50 s - 4.0 MB - s fresh"
