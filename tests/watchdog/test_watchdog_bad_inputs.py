"""What happens when...: ProgressWatchdog: hangs, crash loops and the attempt history.

Cases of the reliability catalogue (``tests/bad_inputs.py``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
from bad_inputs import (
    Case,
    case,
    cases_of,
    cli,
    first_run,
    fit,
    restart,
    run_case,
)

from lightning_resume import (
    MissingCallbackError,
    RequeueCheckpoint,
    RunDir,
)
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.binding import PROCESS


class _FailsInSetup:
    """A callback whose ``setup`` raises: a restart that fails before ``last.ckpt`` is restored."""

    @staticmethod
    def make() -> object:
        import lightning.pytorch as pl

        class FailsInSetup(pl.Callback):
            def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
                raise RuntimeError("the restart fails in setup")

        return FailsInSetup()


@case(
    "a restart that fails before `last.ckpt` is restored (an error in a callback's `setup`)",
    "`status.json` records `failed` at the step `last.ckpt` holds (not at step 0)",
)
def failed_restart_keeps_the_checkpoint_step(tmp_path: Path) -> None:
    from lightning_resume.run_dir.status import read_status

    run_dir = first_run(tmp_path)  # last.ckpt at step 2
    for before_run_dir in (False, True):  # RunDir's own setup runs, or never does
        PROCESS.reset()
        callbacks = [RunDir(root=tmp_path / "root", key="k"), RequeueCheckpoint(every_n_train_steps=1)]
        callbacks.insert(0 if before_run_dir else 1, _FailsInSetup.make())
        with pytest.raises(RuntimeError, match="fails in setup"):
            fit(tmp_path, *callbacks, steps=4)
        assert read_status(run_dir) | {"time": None, "pid": None} == {
            "status": "failed",
            "step": 2,
            "detail": "RuntimeError",
            "time": None,
            "pid": None,
        }


@case(
    "`WatchdogTimeouts(step=0)`, `WatchdogTimeouts(multiple=0.5)`, `ProgressWatchdog(timeouts=5)`, "
    "`max_attempts_without_progress=True`",
    "`ValueError` / `TypeError` naming the value, at construction",
)
def bad_watchdog_arguments(tmp_path: Path) -> None:
    from lightning_resume import ProgressWatchdog, WatchdogTimeouts

    for kwargs, error in (({"step": 0}, ValueError), ({"multiple": 0.5}, ValueError)):
        with pytest.raises(error, match=re.escape(repr(next(iter(kwargs.values()))))):
            WatchdogTimeouts(**kwargs)  # type: ignore[arg-type]
    for kwargs, error in (({"timeouts": 5}, TypeError), ({"max_attempts_without_progress": True}, TypeError)):
        with pytest.raises(error, match=re.escape(repr(next(iter(kwargs.values()))))):
            ProgressWatchdog(**kwargs)  # type: ignore[arg-type]


@case(
    "`ProgressWatchdog` without `RunDir`",
    "`MissingCallbackError` at `setup`, naming `RunDir`; the watchdog thread stops with `fit`",
)
def watchdog_without_run_dir(tmp_path: Path) -> None:

    from lightning_resume import ProgressWatchdog

    watchdog = ProgressWatchdog()
    with pytest.raises(MissingCallbackError, match="RunDir") as raised:
        fit(tmp_path, watchdog)
    assert raised.value.needed == "RunDir" and raised.value.needed_by == "ProgressWatchdog"
    for _ in range(50):
        if not watchdog._dog.alive:
            break
        time.sleep(0.1)
    assert not watchdog._dog.alive


@case(
    "an `attempts.json` that is not JSON",
    "read as an empty history: the restart resumes and rewrites it; `inspect` works",
)
def unreadable_attempt_history(tmp_path: Path) -> None:
    from lightning_resume.run_dir import attempts

    run_dir = first_run(tmp_path)
    (run_dir / layout.ATTEMPTS).write_text("{garbage")
    restart(tmp_path)
    history = attempts.read(run_dir)
    assert [a.resumed_from for a in history.attempts] == [2]
    code, out, err = cli("inspect", run_dir, "--json")
    assert code == 0 and json.loads(out)["attempts"]["count"] == 1, err


@case(
    "`attempts.json` cannot be written (a directory in its place)",
    "one warning; `fit` finishes, or fails with its own error, as if nothing were recorded",
)
def attempt_history_write_fails(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    run_dir = RunDir(root=tmp_path / "root", key="k")
    (run_dir.path / layout.ATTEMPTS).mkdir()

    class Fail(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
            if trainer.global_step == 2:
                raise KeyError("the user's own error")

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("lightning_resume")
    logger.addHandler(handler)
    try:
        with pytest.raises(KeyError, match="the user's own error"):
            fit(tmp_path, run_dir, RequeueCheckpoint(every_n_train_steps=1), Fail(), steps=4)
    finally:
        logger.removeHandler(handler)
    warnings = [r for r in records if "could not record the attempt" in r.getMessage()]
    assert len(warnings) == 1


@case(
    "`lightning-resume reset-crash-loop` of a path that is not a run dir",
    "one line on stderr and exit status 2",
)
def reset_crash_loop_of_a_non_run_dir(tmp_path: Path) -> None:
    for path in (tmp_path / "nope", tmp_path):
        code, _, err = cli("reset-crash-loop", path)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "not a run dir" in err, err


@pytest.mark.parametrize("entry", cases_of(__name__), ids=lambda c: c.name)
def test_catalogue(entry: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_case(entry, tmp_path, request)
