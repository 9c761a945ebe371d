"""A stand-in ``scontrol`` on ``PATH`` that logs its calls, for tests that check which requeue is issued.

The real cluster runs in ``tests/slurm/``; a stand-in pins the calls (and that there is exactly one
requeue) in the default run, where a job only pretends to be a SLURM job.
"""

from __future__ import annotations

import os
from pathlib import Path


def fake_scontrol(folder: Path, state: str = "RUNNING") -> tuple[dict[str, str], Path]:
    """An environment whose ``scontrol`` logs its arguments and reports ``state``; and the log."""
    log = folder / "scontrol.log"
    script = folder / "bin" / "scontrol"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(
        f'#!/bin/sh\necho "$@" >> "{log}"\nif [ "$1" = "-o" ]; then echo "JobId=$4 JobState={state}"; fi\n'
    )
    script.chmod(0o755)
    return {"PATH": f"{script.parent}{os.pathsep}{os.environ['PATH']}"}, log
