"""The local SLURM cluster (``tests/slurm/cluster.sh``) does what the library's SLURM tests rely on.

Plain batch jobs complete and are recorded by accounting (submitit reads ``sacct``), ``scontrol requeue``
reruns a job under the same id with ``SLURM_RESTART_COUNT=1``, and a job in ``high`` preempts a job in
``low``: the victim gets its ``--signal`` at once, SIGTERM when the partition's GraceTime is over, and
is requeued.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REQUEUE_JOB = """\
#!/bin/bash
echo "run ${SLURM_RESTART_COUNT-unset} $(date +%s.%N)"
if [ -z "${SLURM_RESTART_COUNT:-}" ]; then sleep 300; fi
"""

# Preemption victim, signal caught by the batch shell (sbatch --signal=B:USR1@...).
BATCH_VICTIM = """\
#!/bin/bash
marks=$1
n=${SLURM_RESTART_COUNT:-0}
mark() { echo "$1 $n $(date +%s.%N)" >>"$marks"; }
if [ "$n" -ge 1 ]; then mark start; mark done; exit 0; fi
trap 'mark usr1' USR1
trap 'mark term; exit 143' TERM
mark start
# `wait` returns for each trapped signal; the loop goes on waiting until SIGTERM.
sleep 300 & pid=$!
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done
"""

# Preemption victim, signal caught by a Python process in an srun step (sbatch --signal=USR1@...): the
# shape of a Lightning job.
STEP_VICTIM = """\
import os, signal, sys, time

marks = sys.argv[1]
n = os.environ.get("SLURM_RESTART_COUNT", "0")


def mark(event):
    with open(marks, "a") as f:
        f.write(f"{event} {n} {time.time():.6f}\\n")


if n != "0":
    mark("start")
    mark("done")
    sys.exit(0)
signal.signal(signal.SIGUSR1, lambda *_: mark("usr1"))


def on_term(*_):
    mark("term")
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
mark("start")
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    time.sleep(0.05)
"""


def report(capsys: pytest.CaptureFixture[str], text: str) -> None:
    """Show a measurement in the normal pytest output."""
    with capsys.disabled():
        print(f"\n    {text}", end="")


def events(lines: list[str]) -> list[tuple[str, int, float]]:
    return [(name, int(n), float(t)) for name, n, t in (line.split() for line in lines)]


def test_batch_job_completes(slurm, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    job = slurm.sbatch("-o", out, "--wrap", "echo hello from $SLURM_JOB_ID")
    slurm.wait_state(job, {"COMPLETED"}, timeout=30)
    assert out.read_text().strip() == f"hello from {job}"
    # submitit's job.state comes from the accounting database.
    slurm.wait_sacct_state(job, "COMPLETED", timeout=30)


def test_requeue_reruns_job_with_restart_count(slurm, tmp_path: Path, capsys) -> None:
    script, out = tmp_path / "job.sh", tmp_path / "job.out"
    script.write_text(REQUEUE_JOB)
    job = slurm.sbatch("-o", out, "--open-mode=append", script)
    slurm.wait_state(job, {"RUNNING"}, timeout=30)
    slurm.wait_lines(out, lambda lines: any(x.startswith("run ") for x in lines), timeout=30)

    requeued_at = time.time()
    slurm.run("scontrol", "requeue", job)
    lines = slurm.wait_lines(out, lambda lines: any(x.startswith("run 1 ") for x in lines), timeout=60)
    record = slurm.wait_state(job, {"COMPLETED"}, timeout=30)

    runs = [line.split() for line in lines if line.startswith("run ")]
    # Same job id, same (appended) log; SLURM_RESTART_COUNT is unset on the first run.
    assert [r[1] for r in runs] == ["unset", "1"], lines
    assert record["JobId"] == job
    assert record["Restarts"] == "1"
    report(capsys, f"requeue -> restart latency: {float(runs[1][2]) - requeued_at:.1f} s")


# The step variant (a Python process under srun) is what tests/slurm/test_preemption_slurm.py runs
# with the real library; here the batch-shell variant pins the cluster behaviour alone.
@pytest.mark.parametrize("where", ["batch"])
def test_preemption_signals_then_requeues(slurm, tmp_path: Path, capsys, where: str) -> None:
    marks, out = tmp_path / "marks", tmp_path / "low.out"
    if where == "batch":
        script = tmp_path / "victim.sh"
        script.write_text(BATCH_VICTIM)
        signal_spec = "B:USR1@60"
    else:
        payload = tmp_path / "victim.py"
        payload.write_text(STEP_VICTIM)
        script = tmp_path / "victim.sh"
        script.write_text(
            f'#!/bin/bash\nsrun {shlex.quote(sys.executable)} {shlex.quote(str(payload))} "$1"\n'
        )
        signal_spec = "USR1@60"

    # --exclusive on both: the high job needs the node the low job holds.
    low = slurm.sbatch(
        "-p", "low", "--exclusive", f"--signal={signal_spec}", "--open-mode=append", "-o", out, script, marks
    )
    slurm.wait_state(low, {"RUNNING"}, timeout=30)
    slurm.wait_lines(marks, lambda lines: len(lines) >= 1, timeout=30)

    submitted_at = time.time()
    high = slurm.sbatch(
        "-p", "high", "--exclusive", "-o", tmp_path / "high.out",
        "--wrap", f'echo "high 0 $(date +%s.%N)" >>{shlex.quote(str(marks))}; sleep 1',
    )  # fmt: skip
    lines = slurm.wait_lines(marks, lambda lines: any(x.startswith("done ") for x in lines), timeout=90)

    seen = events(lines)
    assert [(name, n) for name, n, _ in seen] == [
        ("start", 0),
        ("usr1", 0),
        ("term", 0),
        ("high", 0),
        ("start", 1),
        ("done", 1),
    ], lines
    assert slurm.wait_state(high, {"COMPLETED"}, timeout=30)["JobState"] == "COMPLETED"
    record = slurm.wait_state(low, {"COMPLETED"}, timeout=30)
    assert record["Restarts"] == "1"
    t = {(name, n): at for name, n, at in seen}
    report(
        capsys,
        f"preemption ({where}): USR1 {t['usr1', 0] - submitted_at:.1f} s after the high job was submitted, "
        f"SIGTERM {t['term', 0] - t['usr1', 0]:.1f} s later (GraceTime), "
        f"restart {t['start', 1] - t['term', 0]:.1f} s after SIGTERM",
    )
