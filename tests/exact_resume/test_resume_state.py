"""The exact resume's one state: its named stages and the transitions between them (no Trainer)."""

from __future__ import annotations

import pytest

from lightning_resume.exact_resume.resume_state import Loaded, ResumeState, Stage


def test_a_validation_interrupted_by_a_preemption_is_redone_through_named_stages() -> None:
    loaded = Loaded(ranks=[{}], mid_epoch=True, batches=3, in_validation=True)
    state = ResumeState().load(loaded)
    assert (state.stage, state.loaded) == (Stage.LOADED, loaded)
    state = state.redo_validation_from({"torch": 1})
    assert (state.stage, state.rng) == (Stage.VALIDATION_TO_REDO, {"torch": 1})
    state = state.redo_validation_now()
    assert state.stage is Stage.REDOING_VALIDATION
    saving = state.saving_in_validation()  # a second preemption, inside the redone validation
    assert saving.stage is Stage.SAVING_IN_VALIDATION and saving.saved() is state
    assert state.validation_redone() == ResumeState()


def test_a_hook_order_the_state_does_not_know_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no transition 'validation_redone' from 'idle'"):
        ResumeState().validation_redone()
    with pytest.raises(RuntimeError, match="no transition 'redo_validation_from' from 'idle'"):
        ResumeState().redo_validation_from({})


def test_a_state_saved_by_an_older_version_loads_with_defaults() -> None:
    assert Loaded.from_state_dict({"global_step": 4}) is None
    assert Loaded.from_state_dict({"ranks": [{}]}) == Loaded([{}], mid_epoch=True, batches=0)
