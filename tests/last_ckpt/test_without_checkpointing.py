"""``Trainer(enable_checkpointing=False)`` with the callbacks only (neuralforecast builds its Trainer from
keyword arguments that way): Lightning takes ``RequeueCheckpoint``, whose ``last.ckpt`` is for resuming
only, adds no checkpoint of its own, and a job killed in the middle of an epoch resumes exactly, on
``lightning`` and on the standalone ``pytorch_lightning``."""

from __future__ import annotations

from pathlib import Path

import _retrofit
import pytest
from conftest import same_weights, tiny_trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_resume import RequeueCheckpoint, RunDir


def test_checkpointing_off_takes_the_callbacks_and_adds_no_checkpoint_of_its_own(tmp_path: Path) -> None:
    requeue = RequeueCheckpoint(every_n_train_steps=2)
    trainer = tiny_trainer(
        RunDir(root=tmp_path / "runs"), requeue, tmp_path=tmp_path, enable_checkpointing=False
    )
    assert trainer.checkpoint_callbacks == [requeue]
    trainer.fit(BoringModel())
    assert Path(requeue.ckpt_path).is_file()
    assert not list(tmp_path.glob("**/epoch=*.ckpt"))  # none of Lightning's own
    # A checkpoint of the user's own still contradicts enable_checkpointing=False, as without us.
    with pytest.raises(MisconfigurationException, match="enable_checkpointing=False"):
        tiny_trainer(RequeueCheckpoint(), ModelCheckpoint(), tmp_path=tmp_path, enable_checkpointing=False)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("--durable",), marks=pytest.mark.long),
        pytest.param(("--standalone",), marks=pytest.mark.slow),
    ],
    ids=["lightning", "pytorch_lightning"],
)
def test_a_trainer_built_from_kwargs_without_checkpointing_killed_mid_epoch_resumes_exactly(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, args: tuple[str, ...]
) -> None:
    output = _retrofit.killed_and_relaunched(tmp_path, "--shape", "kwargs", *args)
    assert "Restored all states from the checkpoint" in output
    assert same_weights(tmp_path / "out.pt", _retrofit.reference(tmp_path_factory))
