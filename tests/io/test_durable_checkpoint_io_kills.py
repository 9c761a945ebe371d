"""SIGKILL of the writer, of the trainer, or of both, at random instants while checkpoints are saved.

A runner process (this file run as a script) imports lightning once and forks one training process
per trial. Each trains a small model with ``ModelCheckpoint`` saving ``last.ckpt`` and the top two
``step=N.ckpt`` every step through an asynchronous ``DurableCheckpointIO``, so a kill nearly always
lands while a save is being written. After each kill (and the orphaned writer, if any, has finished)
the runner checks the directory, and the next trial resumes with ``fit(ckpt_path="last")`` and
reports the step it resumed from.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve()


def run_trials(tmp_path: Path, trials: int, seed: int) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE), str(tmp_path / "ckpt"), str(trials), str(seed)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 6 * trials, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def landed_mid_write(report: dict[str, Any]) -> bool:
    """Whether some kill or freeze found a save half-written (its temporary file on disk)."""
    return any(t["litter"] for t in report["trials"])


def check(report: dict[str, Any], trials: int) -> None:
    assert len(report["trials"]) == trials
    for trial in report["trials"]:
        assert trial["torn"] == [], trial
        if trial["expected_start"] is not None:
            assert trial["start"] == trial["expected_start"], trial  # resumed from the verified last.ckpt
    kinds = {t["kind"] for t in report["trials"]}
    assert kinds == {"trainer", "writer", "both"}
    final = report["final"]
    assert final["torn"] == [] and final["litter"] == [] and final["orphans"] == []
    assert final["start"] == report["trials"][-1]["verified_step"]


def test_kill_9_during_saves_never_leaves_a_torn_checkpoint(tmp_path: Path) -> None:
    # The instants are random: most batches of 20 land a kill mid-write; on a loaded machine one may
    # not, and then another batch runs (a batch without one proves nothing, but is still checked).
    for seed in range(3):
        report = run_trials(tmp_path / f"seed-{seed}", trials=20, seed=seed)
        check(report, 20)
        if landed_mid_write(report):
            return
    pytest.fail("no kill landed mid-write in 3 batches of 20 trials: the test proves nothing")


@pytest.mark.slow
def test_kill_9_during_saves_many_trials(tmp_path: Path) -> None:
    report = run_trials(tmp_path, trials=300, seed=1)
    check(report, 300)
    assert landed_mid_write(report), "no kill landed mid-write: the test proves nothing"


# ---------------------------------------------------------------------------------------------------
# The runner (this file run as a script). No torch computation happens here before forking.


def _train(folder: Path, report_fd: int, max_steps: int) -> None:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_resume import DurableCheckpointIO

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.Linear(512, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    io = DurableCheckpointIO()
    out = os.fdopen(report_fd, "w", buffering=1)

    class Report(pl.Callback):
        writer: int | None = None

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            out.write(f"START {trainer.global_step}\n")

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if io._writer_pid not in (None, self.writer):
                self.writer = io._writer_pid
                out.write(f"WRITER {self.writer}\n")  # the first one, and each restarted one

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 64), torch.randn(64, 1))
    trainer = pl.Trainer(
        max_steps=max_steps,
        plugins=[io],
        callbacks=[
            Report(),
            ModelCheckpoint(
                dirpath=folder,
                filename="{step}",
                every_n_train_steps=1,
                save_top_k=2,
                monitor="step",
                mode="max",
                save_last=True,
            ),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    resume = "last" if (folder / "last.ckpt").exists() else None
    trainer.fit(Model(), DataLoader(data, batch_size=8), ckpt_path=resume)
    out.write("DONE\n")


def _fork_trainer(folder: Path, max_steps: int = 10**6) -> tuple[int, Any]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the training process
        os.close(read)
        os.setpgid(0, 0)
        log = os.open(folder.parent / "trainer.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(log, 1)
        os.dup2(log, 2)
        code = 0
        try:
            _train(folder, write, max_steps)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(write)
    return pid, os.fdopen(read)


def _become_subreaper() -> None:
    """Orphaned writers become our children, so we can reap them (and see when they are gone)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _wait_group_gone(pgid: int, timeout: float = 30.0) -> None:
    """Wait until every process of the trainer's group (an orphaned writer) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.005)
    raise TimeoutError(f"process group {pgid} still alive after {timeout} s")


def _inspect(folder: Path) -> dict[str, Any]:
    from lightning_resume._storage.manifest import checksum_file, read_entries

    torn, step = [], None
    for path in sorted(folder.glob("*.ckpt")):
        found = checksum_file(path)
        entry = next((e for e in read_entries(path) or [] if (e.size, e.checksum) == found), None)
        if entry is None:
            torn.append(path.name)
        elif path.name == "last.ckpt":
            step = entry.global_step
    names = os.listdir(folder) if folder.exists() else []
    return {
        "torn": torn,
        "verified_step": step,
        "litter": [n for n in names if n.startswith(".lr-tmp-")],
        "orphans": [
            n for n in names if n.endswith(".manifest.json") and n[: -len(".manifest.json")] not in names
        ],
    }


def _read_line(stream: Any, prefix: str, skip: str | None = None) -> str:
    while True:
        line = stream.readline()
        if skip is None or not line.startswith(skip):
            break
    if not line.startswith(prefix):
        raise RuntimeError(f"trainer said {line!r}, expected {prefix!r}; see trainer.log")
    return line.split()[1] if len(line.split()) > 1 else ""


def _next_writer(stream: Any, old: int) -> int:
    while (pid := int(_read_line(stream, "WRITER"))) == old:
        pass
    return pid


def main(folder: Path, trials: int, seed: int) -> None:
    import lightning.pytorch  # noqa: F401  (imported once, before forking)

    folder.mkdir(parents=True, exist_ok=True)
    _become_subreaper()
    rng = random.Random(seed)
    report: dict[str, Any] = {"trials": []}
    expected: int | None = None
    while len(report["trials"]) < trials:
        pid, stream = _fork_trainer(folder)
        start = int(_read_line(stream, "START"))
        writer = int(_read_line(stream, "WRITER"))
        # Some writer kills; the trainer restarts its writer and goes on. Each is checked with the
        # whole group frozen at a random instant: what is on disk must verify at any instant.
        for _ in range(min(rng.randint(0, 3), trials - len(report["trials"]) - 1)):
            time.sleep(rng.uniform(0.0, 0.2))
            os.kill(writer, signal.SIGKILL)
            time.sleep(rng.uniform(0.0, 0.2))
            os.killpg(pid, signal.SIGSTOP)
            state = _inspect(folder)
            os.killpg(pid, signal.SIGCONT)
            report["trials"].append({"kind": "writer", "start": None, "expected_start": None, **state})
            writer = _next_writer(stream, writer)
        # Then the trainer dies (its writer, orphaned, finishes the save in hand), or both die.
        kind = rng.choice(["trainer", "both"])
        time.sleep(rng.uniform(0.0, 0.3))
        if kind == "trainer":
            os.kill(pid, signal.SIGKILL)
        else:
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        stream.close()
        _wait_group_gone(pid)
        state = _inspect(folder)
        report["trials"].append({"kind": kind, "start": start, "expected_start": expected, **state})
        expected = state["verified_step"]
    pid, stream = _fork_trainer(folder, (expected or 0) + 5)
    start = int(_read_line(stream, "START"))
    _read_line(stream, "WRITER")
    _read_line(stream, "DONE")
    os.waitpid(pid, 0)
    _wait_group_gone(pid)
    report["final"] = {"start": start, **_inspect(folder)}
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
