"""Real signals to real jobs: no lost work, no hangs, a non-zero exit, an exact resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
from conftest import JOB_MODULE, job_env, run_job, same_weights, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import Preempted, PreemptionHandler, RequeueCheckpoint, RunDir

EXIT = 143


def test_sigterm_during_training_saves_exits_non_zero_and_resumes_exactly(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(root, out, "--preemption", "--signal-at", "7", LIGHTNING_RESUME_KEY="sig")
    assert first.returncode == EXIT, first.output
    assert "Preempted by SIGTERM at step 8" in first.output
    assert "fit ended by SIGTERM at step 8; requeue: none (not a SLURM job)" in first.output
    again = run_job(root, out, "--preemption", LIGHTNING_RESUME_KEY="sig")
    assert again.returncode == 0, again.output
    assert "Restoring states" in again.output
    assert same_weights(out, baseline["stateful"])


def test_without_preemption_handler_lightning_exits_zero(tmp_path: Path) -> None:
    """The behaviour PreemptionHandler fixes: Lightning alone reports a SIGTERM'd fit as a success."""
    first = run_job(tmp_path / "runs", tmp_path / "out.pt", "--signal-at", "7", LIGHTNING_RESUME_KEY="plain")
    assert first.returncode == 0


@pytest.mark.long
def test_ddp_signal_to_one_rank_stops_every_rank_and_resumes_exactly(tmp_path: Path) -> None:
    args = ("--devices", "2", "--loader", "plain", "--every", "0", "--preemption")
    ref = run_job(tmp_path / "ref", tmp_path / "ref.pt", *args)
    assert ref.returncode == 0, ref.output
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(
        root, out, *args, "--signal-at", "11", "--signal-rank", "1", LIGHTNING_RESUME_KEY="d", timeout=120
    )
    assert first.returncode == EXIT, first.output
    assert "Preempted by a signal on another rank at step 12" in first.output
    again = run_job(root, out, *args, LIGHTNING_RESUME_KEY="d", timeout=120)
    assert again.returncode == 0, again.output
    assert same_weights(out, tmp_path / "ref.pt")


def test_sigterm_in_the_setup_window_exits_non_zero_at_once(tmp_path: Path) -> None:
    out = tmp_path / "out.pt"
    cmd = [
        sys.executable,
        "-m",
        JOB_MODULE,
        "--root",
        str(tmp_path / "runs"),
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        [*cmd, "--preemption", "--setup-sleep", "60"], env=job_env(), stderr=subprocess.PIPE, text=True
    )
    marker = Path(f"{out}.setup")
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == EXIT, err
    assert "not training yet: exiting now" in err


def test_a_second_signal_while_stopping_is_ignored(tmp_path: Path) -> None:
    first = run_job(
        tmp_path / "runs", tmp_path / "o.pt", "--preemption", "--signal-at", "3", "--signal-count", "2"
    )
    assert first.returncode == EXIT, first.output
    assert first.output.count("Preempted by SIGTERM") == 1
    assert "SIGTERM received while already stopping for SIGTERM: ignored" in first.output


def test_sigterm_is_handled_even_when_previously_ignored(tmp_path: Path) -> None:
    first = run_job(
        tmp_path / "runs", tmp_path / "o.pt", "--preemption", "--signal-at", "3", "--before", "ignore"
    )
    assert first.returncode == EXIT, first.output


def test_a_user_handler_is_still_called(tmp_path: Path) -> None:
    out = tmp_path / "o.pt"
    first = run_job(tmp_path / "runs", out, "--preemption", "--signal-at", "3", "--before", "user")
    assert first.returncode == EXIT, first.output
    assert Path(f"{out}.user-handler").read_text() == "called\n"


def _fit(tmp_path: Path, *callbacks: pl.Callback) -> pl.Trainer:
    trainer = tiny_trainer(*callbacks, tmp_path=tmp_path)
    trainer.fit(BoringModel())
    return trainer


def test_handlers_before_construction_are_restored_after_fit(tmp_path: Path) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    handler = PreemptionHandler()
    assert signal.getsignal(signal.SIGTERM) == handler._handle
    _fit(tmp_path, RunDir(root=tmp_path / "runs"), RequeueCheckpoint(), handler)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_slurm_auto_requeue_installs_nothing_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With our SIGUSR1 handler in place, Lightning's SLURM requeue (hpc_ckpt files) stays off."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    for var, value in {
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_ID": "55",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
    }.items():
        monkeypatch.setenv(var, value)
    handler = PreemptionHandler()

    class Peek(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.usr1 = signal.getsignal(signal.SIGUSR1)

    peek = Peek()
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        plugins=[SLURMEnvironment(auto_requeue=True)],
        default_root_dir=tmp_path,
        callbacks=[peek, RunDir(root=tmp_path / "runs"), RequeueCheckpoint(), handler],
    )
    trainer.fit(BoringModel())
    assert peek.usr1 == handler._handle


def test_needs_requeue_checkpoint_and_a_non_zero_exit_code(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"exit_code must be within 1\.\.255, got 0: 0 tells the scheduler"):
        PreemptionHandler(exit_code=0)
    with pytest.raises(ValueError, match="Unknown signal 'SIGNOPE'"):
        PreemptionHandler(signals=["SIGNOPE"])
    with pytest.raises(ValueError, match="add RequeueCheckpoint"):
        _fit(tmp_path, RunDir(root=tmp_path / "runs"), PreemptionHandler())


def test_preempted_is_a_system_exit_with_the_status() -> None:
    assert issubclass(Preempted, SystemExit)
    assert Preempted(EXIT).code == EXIT
    assert os.name == "posix"


def _sleep_forever() -> None:
    time.sleep(60)


def test_a_forked_child_keeps_what_it_had_without_us() -> None:
    """A child forked by some library gets the default action for SIGTERM, not our handler's silence."""
    import multiprocessing

    handler = PreemptionHandler(signals=["SIGTERM"])
    try:
        child = multiprocessing.get_context("fork").Process(target=_sleep_forever)
        child.start()
        time.sleep(0.5)
        os.kill(child.pid or 0, signal.SIGTERM)
        child.join(timeout=10)
        assert child.exitcode == -signal.SIGTERM  # killed by the signal, as without PreemptionHandler
        assert handler.received is None  # and the training process did not take it for its own
    finally:
        handler.uninstall()


def test_a_signal_while_the_process_exits_is_ignored_without_a_traceback(tmp_path: Path) -> None:
    """A scheduler's SIGTERM as the interpreter runs its exit handlers (after fit): no traceback."""
    code = (
        "import atexit, os, signal\n"
        "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))  # runs after ours\n"
        "from lightning_resume import PreemptionHandler\n"
        "handler = PreemptionHandler()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=job_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "SIGTERM received while the process exits: ignored" in done.stderr
