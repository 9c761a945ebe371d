"""Each DDP rank's scheduler and callback states: taken from the dict a rank built, put back into the
one rank 0 wrote. No Trainer: two ranks are two dicts, as ``dump_checkpoint`` builds them
(the real two-rank kill is ``tests/last_ckpt/test_epoch_boundary.py``, marked slow)."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.callbacks import EarlyStopping

from lightning_resume.exact_resume.per_rank_states import SMALL_STATE_BYTES, capture, put_back

OWN = "RequeueCheckpoint{}"
STOP = EarlyStopping(monitor="val_loss").state_key


def plateau() -> torch.optim.lr_scheduler.ReduceLROnPlateau:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)


def rank_checkpoint(scheduler: Any, stopping: EarlyStopping) -> dict[str, Any]:
    """What ``dump_checkpoint`` builds on one rank (the parts this module reads)."""
    return {
        "lr_schedulers": [scheduler.state_dict()],
        "callbacks": {STOP: stopping.state_dict(), OWN: {"ranks": ["every rank's"]}},
    }


def test_a_rank_resumed_with_its_own_plateau_state_lowers_the_lr_as_the_uninterrupted_rank_does() -> None:
    # val_loss logged without sync_dist: each rank's scheduler follows its own value.
    ranks = [plateau(), plateau()]
    for scheduler, loss in zip(ranks, (6.0, 4.0), strict=True):
        scheduler.step(loss)
    written = rank_checkpoint(ranks[0], EarlyStopping(monitor="val_loss"))  # rank 0's is the file
    mine = capture(rank_checkpoint(ranks[1], EarlyStopping(monitor="val_loss")), OWN)
    put_back(written, mine)

    resumed = plateau()
    resumed.load_state_dict(written["lr_schedulers"][0])
    ranks[1].step(5.0)  # worse than rank 1's best (4.0), better than rank 0's (6.0)
    resumed.step(5.0)
    assert ranks[1].optimizer.param_groups[0]["lr"] == 0.5
    assert resumed.optimizer.param_groups[0]["lr"] == 0.5


def test_a_rank_gets_its_own_callback_states_and_the_others_are_left_alone() -> None:
    zero, one = EarlyStopping(monitor="val_loss"), EarlyStopping(monitor="val_loss")
    zero.best_score, one.best_score = torch.tensor(6.0), torch.tensor(4.0)
    one.wait_count = 2
    written = rank_checkpoint(plateau(), zero)
    written["callbacks"]["Other"] = {"n": 1}
    mine = capture(rank_checkpoint(plateau(), one), OWN)
    assert OWN not in mine["callbacks"]  # its own state holds every rank's already
    put_back(written, mine)

    resumed = EarlyStopping(monitor="val_loss")
    resumed.load_state_dict(written["callbacks"][STOP])
    assert (resumed.wait_count, float(resumed.best_score)) == (2, 4.0)
    assert written["callbacks"]["Other"] == {"n": 1}
    assert written["callbacks"][OWN] == {"ranks": ["every rank's"]}


def test_captured_states_are_copies_that_later_training_does_not_change() -> None:
    best = torch.tensor(4.0)
    mine = capture({"callbacks": {STOP: {"best_score": best}}}, OWN)
    best.add_(1.0)
    assert float(mine["callbacks"][STOP]["best_score"]) == 4.0


def test_model_sized_callback_states_stay_rank_zeros() -> None:
    # Averaged weights (SWA, EMA) are equal on every DDP rank; copying them per rank would cost the model.
    big = {"average_model_state": {"w": torch.zeros(SMALL_STATE_BYTES // 4 + 1)}}
    mine = capture({"callbacks": {"SWA": big, STOP: {"wait_count": 1}}}, OWN)
    assert set(mine["callbacks"]) == {STOP}


def test_other_schedulers_than_saved_keep_rank_zeros() -> None:
    written: dict[str, Any] = {"lr_schedulers": [{"a": 0}, {"b": 0}], "callbacks": {}}
    put_back(written, {"schedulers": [{"a": 1}], "callbacks": {"Gone": {"n": 1}}})
    assert written == {"lr_schedulers": [{"a": 0}, {"b": 0}], "callbacks": {}}
    put_back(written, None)  # a checkpoint of an earlier version: no states per rank
    assert written["lr_schedulers"] == [{"a": 0}, {"b": 0}]


def test_captured_containers_keep_their_types() -> None:
    from collections import OrderedDict, namedtuple

    Pair = namedtuple("Pair", "best count")
    state = {"pair": Pair(torch.tensor(1.0), 2), "ordered": OrderedDict(a=1)}
    kept = capture({"callbacks": {"Mine": state}}, OWN)["callbacks"]["Mine"]
    assert isinstance(kept["pair"], Pair) and kept["pair"].count == 2
    assert isinstance(kept["ordered"], OrderedDict)
