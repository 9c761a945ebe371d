"""``report`` and ``inspect`` tell how an attempt ended by its failure class: "out of memory on rank 1,
exit 71, retried" (retried: a later attempt exists; else whether the class is retryable)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lightning_resume.cli import inspect, report
from lightning_resume.run_dir import attempts
from lightning_resume.run_dir.attempts import Attempt, Cause, End, History

FAILED = End(110.0, Cause.FAILED, "failed: RuntimeError: Connection closed by peer")
OOM = replace(FAILED, failure="out-of-memory", exit_code=71, rank=1, error="OutOfMemoryError: CUDA")
DATA = replace(FAILED, failure="data", exit_code=66, rank=0, error="ValueError: bad sample")


def history(*ends: End) -> History:
    return History(
        attempts=tuple(Attempt(n, "node", n, None, 100.0 * n, end=e) for n, e in enumerate(ends, 1))
    )


def test_report_leads_a_classified_ending_with_its_class() -> None:
    rows = report.build(history(OOM, DATA)).attempts
    assert rows[0].how == "out of memory on rank 1, exit 71, retried: OutOfMemoryError: CUDA"
    assert rows[1].how == "data loading error on rank 0, exit 66, not retryable: ValueError: bad sample"


def test_inspect_says_how_each_classified_attempt_ended(tmp_path: Path) -> None:
    attempts.write(tmp_path, history(OOM, End(300.0, Cause.FINISHED, "finished"), DATA))
    assert inspect.attempts_report(tmp_path)["endings"] == [
        "attempt 1 ended: out of memory on rank 1, exit 71, retried",
        "attempt 3 ended: data loading error on rank 0, exit 66, not retryable",
    ]
