"""What an exact resume holds between hooks: the saved format, and a state whose transitions raise
``RuntimeError`` from a stage they do not name (a hook order not known here)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypedDict

from lightning_resume.exact_resume.per_rank_states import RankOwned
from lightning_resume.exact_resume.trainable import Modes


class RankState(TypedDict, total=False):
    """What one rank stores in the checkpoint (``state_dict()["ranks"][i]``)."""

    rng: dict[str, Any]
    draws: list[Any]  # per plain loader, the random states its epoch was drawn from (.data_position)
    datasets: list[dict[str, Any]]  # the generators of each plain loader's dataset
    metrics: dict[str, Any] | None  # (.epoch_metrics)
    loaders: list[Any] | None  # under DDP: its loader states
    owned: RankOwned  # under DDP: its scheduler and callback states (.per_rank_states)
    check: dict[str, Any] | None  # the self-check's fingerprint at the save (.self_check)
    grads: list[Any]  # gradients the next step adds to (.held_grads)
    frozen: list[str]  # the parameters without requires_grad (.trainable)
    modes: Modes  # the submodules in eval mode, the norm layers not tracking stats (.trainable)
    workers: list[dict[str, Any] | None]  # each plain loader's persistent workers (.persistent_workers)
    val_log_steps: dict[int, int]  # the step of each validation loader's next logged value


@dataclass(frozen=True)
class Loaded:
    """A checkpoint's states still to be applied (every rank's) and the moment it was saved at."""

    ranks: list[RankState]
    mid_epoch: bool
    batches: int
    in_validation: bool = False  # a preemption inside a validation: it runs again
    before_validation: bool = False  # the end of a step a validation followed: it runs again
    between_epochs: bool = False

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Loaded | None:
        """What ``ExactResume.state_dict`` saved (``None`` for a state without ranks)."""
        if not state.get("ranks"):
            return None
        return cls(
            ranks=list(state["ranks"]),
            mid_epoch=bool(state.get("mid_epoch", True)),
            batches=int(state.get("batches", 0)),
            in_validation=bool(state.get("in_validation", False)),
            before_validation=bool(state.get("before_validation", False)),
            between_epochs=bool(state.get("between_epochs", False)),
        )


class Stage(enum.Enum):
    """Where an exact resume stands."""

    IDLE = "idle"
    LOADED = "loaded"
    VALIDATION_TO_REDO = "validation to redo"  # interrupted: it runs again from its starting random state
    REDOING_VALIDATION = "redoing validation"  # as it ends, Lightning's validation progress is settled
    SAVING_IN_VALIDATION = "saving in validation"


@dataclass(frozen=True)
class ResumeState:
    """One stage and the data only it has; each transition returns a new value."""

    stage: Stage = Stage.IDLE
    loaded: Loaded | None = None  # LOADED
    rng: dict[str, Any] | None = None  # VALIDATION_TO_REDO: the validation's starting random state
    before: ResumeState | None = None  # SAVING_IN_VALIDATION: the state to go back to

    def _check(self, transition: str, *allowed: Stage) -> None:
        if self.stage not in allowed:
            raise RuntimeError(f"exact resume: no transition {transition!r} from {self.stage.value!r}")

    def load(self, loaded: Loaded) -> ResumeState:
        return ResumeState(Stage.LOADED, loaded=loaded)

    def applied(self) -> ResumeState:
        self._check("applied", Stage.LOADED)
        return ResumeState()

    def redo_validation_from(self, rng: dict[str, Any]) -> ResumeState:
        self._check("redo_validation_from", Stage.LOADED)
        return ResumeState(Stage.VALIDATION_TO_REDO, rng=rng)

    def redo_validation_now(self) -> ResumeState:
        self._check("redo_validation_now", Stage.IDLE, Stage.LOADED, Stage.VALIDATION_TO_REDO)
        return ResumeState(Stage.REDOING_VALIDATION)

    def validation_redone(self) -> ResumeState:
        self._check("validation_redone", Stage.REDOING_VALIDATION)
        return ResumeState()

    def saving_in_validation(self) -> ResumeState:
        return ResumeState(Stage.SAVING_IN_VALIDATION, before=self)

    def saved(self) -> ResumeState:
        self._check("saved", Stage.SAVING_IN_VALIDATION)
        assert self.before is not None
        return self.before
