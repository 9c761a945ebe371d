"""The exit hook in a real interpreter: the armed exception (or one raised from it) reaching the top ends
the process with the armed status, after the traceback and the hook installed before; anything else
keeps Python's 1."""

from __future__ import annotations

import subprocess
import sys

import pytest

PRELUDE = """
import atexit, sys
from lightning_resume.exit_status.exit_hook import EXIT_HOOK
atexit.register(lambda: print("EXIT HANDLERS RAN", flush=True))
def previous(kind, value, trace):
    print("PREVIOUS HOOK", kind.__name__, flush=True)
sys.excepthook = previous
failure = RuntimeError("Connection closed by peer")
EXIT_HOOK.arm(failure, 71)
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("raise failure", 71),
        ("raise KeyError('wrapped') from failure", 71),  # a script that wraps fit's exception
        ("raise ValueError('another error')", 1),
        ("EXIT_HOOK.disarm()\nraise failure", 1),
    ],
    ids=["the-armed-one", "raised-from-it", "another", "disarmed"],
)
def test_only_the_armed_exception_changes_the_exit_status(code: str, status: int) -> None:
    done = run(code)
    assert done.returncode == status, done.stderr
    assert "EXIT HANDLERS RAN" in done.stdout
    if status == 71:
        assert "PREVIOUS HOOK" in done.stdout  # the traceback is printed as before ours
    if "disarm" in code:
        assert "PREVIOUS HOOK" in done.stdout  # the hook before ours is back


def test_the_hook_removes_itself_when_it_runs() -> None:
    done = run("EXIT_HOOK(KeyError, KeyError(), None)\nprint('HOOK NOW', sys.excepthook.__name__)")
    assert "HOOK NOW previous" in done.stdout, done.stdout + done.stderr
