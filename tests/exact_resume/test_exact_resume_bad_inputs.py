"""What happens when...: exact resume: another number of ranks, epoch boundaries and step-based training.

Cases of the reliability catalogue (``tests/bad_inputs.py``).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from bad_inputs import (
    _REQUEST,
    Case,
    case,
    cases_of,
    run_case,
)
from conftest import built_once, run_job, same_weights, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import (
    RequeueCheckpoint,
    ResumeError,
    RunDir,
)
from lightning_resume.run_dir.binding import PROCESS


def _fit_loader(tmp_path: Path, loader: object, steps: int, *extra: pl.Callback, **requeue: bool) -> None:
    """A process's fit of session ``k`` on ``loader``, saving every step."""
    PROCESS.reset()
    callbacks = (RunDir(root=tmp_path / "root", key="k"), RequeueCheckpoint(every_n_train_steps=1, **requeue))
    trainer = tiny_trainer(
        *callbacks, *extra, tmp_path=tmp_path, max_steps=steps, max_epochs=5, limit_train_batches=None
    )
    trainer.fit(BoringModel(), loader)  # type: ignore[arg-type]


@case(
    "a restart with `RequeueCheckpoint(keep_global_batch=True)` whose ranks and batch size do not divide "
    "the checkpoint's global batch",
    "`ResumeError` at train start naming both numbers and what to do",
)
def keep_global_batch_that_does_not_divide(tmp_path: Path) -> None:
    from lightning.pytorch.demos.boring_classes import RandomDataset
    from torch.utils.data import DataLoader

    _fit_loader(tmp_path, DataLoader(RandomDataset(32, 64), batch_size=6), steps=2)
    with pytest.raises(ResumeError, match=r"global batch of 6 samples is not a multiple of the 4 samples"):
        _fit_loader(tmp_path, DataLoader(RandomDataset(32, 64), batch_size=4), 4, keep_global_batch=True)


class _StopAt(pl.Callback):
    """Fail at a global step, after that step's save (a crash in the middle of the epoch)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"stopped at step {self.step}")


@case(
    "a mid-epoch restart on another number of ranks with an `IterableDataset` (or a custom sampler, "
    "several train loaders)",
    "one warning: the epoch's rest cannot be split exactly (samples repeated or skipped) and what to do",
)
def other_ranks_with_an_iterable_dataset(tmp_path: Path) -> None:
    from lightning.pytorch.demos.boring_classes import RandomIterableDataset
    from torch.utils.data import DataLoader

    with pytest.raises(RuntimeError, match="stopped at step 3"):
        _fit_loader(tmp_path, DataLoader(RandomIterableDataset(32, 64), batch_size=2), 9, _StopAt(3))
    (run_dir,) = [d for d in (tmp_path / "root").glob("[0-9]*/[0-9]*/*") if d.is_dir()]
    # Two real ranks cost two processes; all a restart reads of them is the list of rank states.
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    data = torch.load(checkpoint, weights_only=False)
    state = data["callbacks"]["ExactResume"]
    state["ranks"] = [state["ranks"][0], state["ranks"][0]]
    torch.save(data, checkpoint)
    with pytest.warns(
        UserWarning, match=r"cannot continue that epoch's order exactly \(.*IterableDataset"
    ) as w:
        _fit_loader(tmp_path, DataLoader(RandomIterableDataset(32, 64), batch_size=2), 6)
    assert len([m for m in w if "cannot continue" in str(m.message)]) == 1


# 12 batches per epoch: the epoch-end checkpoint of epoch 0 is at step 12; no periodic saves.
STEPS = ("--loader", "plain", "--every", "0")


def steps_reference() -> Path:
    """An uninterrupted ``Trainer(max_steps=20)`` run of :data:`STEPS`: its weights and sample log."""

    def build(folder: Path) -> None:
        attempt = run_job(
            folder, folder / "ref.pt", *STEPS, "--max-steps", 20, "--sample-log", folder / "ref.log"
        )
        assert attempt.returncode == 0, attempt.output

    factory = _REQUEST[0].getfixturevalue("tmp_path_factory")
    return built_once(factory, "max-steps-reference", build)


def resumed_max_steps_run(tmp_path: Path, kill: int) -> None:
    """A ``max_steps=20`` run SIGKILLed at step ``kill`` of epoch 1 resumes at 12, exact."""
    reference = steps_reference()
    root, out, log = tmp_path / "runs", tmp_path / "out.pt", tmp_path / "run.log"
    first = run_job(root, out, *STEPS, "--max-steps", 20, "--kill-at", kill, SLURM_JOB_ID=22)
    assert first.returncode == -9, first.output
    again = run_job(
        root, out, *STEPS, "--max-steps", 20, "--sample-log", log, SLURM_JOB_ID=22, SLURM_RESTART_COUNT=1
    )
    assert again.returncode == 0, again.output
    assert "FIRST_STEP rank=0 step=12" in again.output, again.output
    expected = (reference / "ref.log.rank0").read_text().splitlines()[12:]
    assert Path(f"{log}.rank0").read_text().splitlines() == expected, f"kill at {kill}: other batches"
    assert same_weights(out, reference / "ref.pt"), f"kill at {kill}"


@case(
    "`Trainer(max_steps=N)` (no `max_epochs`) killed in the first steps after an epoch-end checkpoint",
    "resumes at the epoch end with the same batches; final weights equal an uninterrupted run",
)
def max_steps_kill_after_an_epoch_end(tmp_path: Path) -> None:
    resumed_max_steps_run(tmp_path, 14)


@pytest.mark.slow
@pytest.mark.parametrize("kill", [13, 15, 16])
def test_max_steps_kill_at_every_step_after_an_epoch_end(
    tmp_path: Path, kill: int, request: pytest.FixtureRequest
) -> None:
    _REQUEST[:] = [request]
    resumed_max_steps_run(tmp_path, kill)


def train_longer(tmp_path: Path, first_steps: int) -> None:
    """A run finished at ``first_steps``, relaunched with ``max_steps=20``: exact."""
    reference = steps_reference()
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(root, out, *STEPS, "--max-steps", first_steps, "--key", "longer")
    assert first.returncode == 0, first.output
    again = run_job(root, out, *STEPS, "--max-steps", 20, "--key", "longer")
    assert again.returncode == 0, again.output
    assert f"FIRST_STEP rank=0 step={first_steps}" in again.output, again.output
    assert again.run_dir == first.run_dir
    assert same_weights(out, reference / "ref.pt")


@case(
    "a finished `max_steps` run relaunched with a larger `max_steps` (train longer)",
    "continues from its last step; final weights equal a run of the larger `max_steps`",
)
def max_steps_train_longer(tmp_path: Path) -> None:
    train_longer(tmp_path, 12)  # it finished exactly at an epoch end


@pytest.mark.slow
def test_train_longer_from_the_middle_of_an_epoch(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _REQUEST[:] = [request]
    train_longer(tmp_path, 17)


@pytest.mark.parametrize("entry", cases_of(__name__), ids=lambda c: c.name)
def test_catalogue(entry: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_case(entry, tmp_path, request)
