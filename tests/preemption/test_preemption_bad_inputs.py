"""What happens when...: PreemptionHandler, signals and notices.

Cases of the reliability catalogue (``tests/bad_inputs.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
from _polls import Polls, wait_for
from bad_inputs import (
    Case,
    case,
    cases_of,
    cli,
    fit,
    run_case,
)
from conftest import job_env, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import (
    PreemptionHandler,
    RequeueCheckpoint,
    RunDir,
)


@case(
    "`PreemptionHandler(exit_code=0 / 256 / True)`",
    "`ValueError` / `TypeError`: the status must be 1..255 (256 would exit 0)",
)
def bad_exit_codes(tmp_path: Path) -> None:
    for code in (0, 256, -1):
        with pytest.raises(ValueError, match=r"exit_code must be within 1\.\.255"):
            PreemptionHandler(exit_code=code)
    with pytest.raises(TypeError, match="exit_code must be a whole number"):
        PreemptionHandler(exit_code=True)


@case(
    '`PreemptionHandler(signals="SIGTERM")` (one name, not a list)',
    'handled as `["SIGTERM"]`',
)
def one_signal_name(tmp_path: Path) -> None:
    handler = PreemptionHandler(signals="SIGTERM")  # type: ignore[arg-type]
    assert handler.signals == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) == handler._handle
    handler.uninstall()


@case(
    '`PreemptionHandler(signals=["SIGKILL"])` or an unknown name',
    "`ValueError`: SIGKILL and SIGSTOP cannot be caught",
)
def uncatchable_signal(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="SIGKILL cannot be caught"):
        PreemptionHandler(signals=["SIGKILL"])
    with pytest.raises(ValueError, match="Unknown signal 'SIGNOPE'"):
        PreemptionHandler(signals=["SIGNOPE"])


@case(
    '`Notices("aws")`, `on_notice="save"`, `margin=0`, `PreemptionHandler(notices="auto")`, '
    '`AwsSpotNotice(endpoint="")`',
    "`ValueError` / `TypeError` naming the value",
)
def bad_notice_arguments(tmp_path: Path) -> None:
    from lightning_resume.notices import AwsSpotNotice, Notices

    with pytest.raises(
        ValueError, match="Notices sources must be 'auto', None or a list of notice sources, got 'aws'"
    ):
        Notices("aws")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got \\[1\\]"):
        Notices([1])  # type: ignore[list-item]
    with pytest.raises(
        ValueError, match="Notices on_notice must be one of 'save_and_continue', 'stop', got 'save'"
    ):
        Notices(on_notice="save")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Notices margin must be > 0, got 0"):
        Notices(margin=0)
    with pytest.raises(TypeError, match=r"notices must be Notices.* got 5"):
        PreemptionHandler(notices=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"endpoint must be a base URL .* got ''"):
        AwsSpotNotice(endpoint="")


@case(
    "a notice file left by an earlier attempt (older than the process)",
    "ignored with one warning: the restart trains on",
)
def stale_notice_file(tmp_path: Path) -> None:
    import warnings

    from lightning_resume.notices import FileNotice, Notices

    flag = tmp_path / "preempted"
    flag.write_text("")
    os.utime(flag, (1.0, 1.0))
    source = FileNotice(flag, interval=0.01)
    polls = Polls(source)
    handler = PreemptionHandler(notices=Notices([source], on_notice="stop"))

    class WaitForTheWarning(pl.Callback):
        def on_train_batch_end(self, *args: object) -> None:
            if wait_for(lambda: [w for w in caught if "older than this process" in str(w.message)], 10):
                polls.more(3, 10)  # polls after the warning, which must not warn again

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(
            tmp_path,
            RunDir(root=tmp_path / "root"),
            RequeueCheckpoint(),
            WaitForTheWarning(),
            handler,
            steps=3,
        )
    assert handler.stop_report is None  # trained to the end
    assert polls.count >= 4  # polled on after the warning
    assert len([w for w in caught if "older than this process" in str(w.message)]) == 1


@case(
    "`$SUBMITIT_PREEMPT_SIGNAL` inherited outside submitit",
    "ignored: a SIGTERM preemption still saves and exits 143; `doctor` warns",
)
def stray_submitit_signal(tmp_path: Path) -> None:
    os.environ["SUBMITIT_PREEMPT_SIGNAL"] = "12"

    class Stop(BoringModel):
        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            if self.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().training_step(batch, batch_idx)

    callbacks = (RunDir(root=tmp_path / "root"), RequeueCheckpoint(), PreemptionHandler())
    trainer = tiny_trainer(*callbacks, tmp_path=tmp_path, max_steps=6, max_epochs=3)
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(Stop())
    assert stopped.value.code == 143
    _, out, err = cli("doctor", "--root", tmp_path, "--json")
    assert "Traceback" not in err
    findings = json.loads(out)
    assert any(f["check"] == "submitit" and f["level"] == "warn" for f in findings)


@case(
    "`SUBMITIT_EXECUTOR=slurm` with `SUBMITIT_PREEMPT_SIGNAL=12`",
    "`doctor` reports an error (submitit expects a name such as USR2), no traceback",
)
def bad_submitit_signal(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_resume", "doctor", "--root", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        env={**job_env(), "SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_PREEMPT_SIGNAL": "12"},
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert any(f["check"] == "submitit" and f["level"] == "error" for f in json.loads(proc.stdout))


@pytest.mark.parametrize("entry", cases_of(__name__), ids=lambda c: c.name)
def test_catalogue(entry: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_case(entry, tmp_path, request)
