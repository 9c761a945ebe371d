"""What an exact resume holds between hooks: the saved format, and one state with named transitions.

A checkpoint's states go back at different moments (see :mod:`.exact_resume`), and a save from inside a
validation stores that validation's starting random state. :class:`ResumeState` says which is under way::

    IDLE ──load──> LOADED ──applied──> IDLE
                     ├──redo_validation_from(rng)──> VALIDATION_TO_REDO ──redo_validation_now──┐
                     └──redo_validation_now──> REDOING_VALIDATION <─────────────────────────────┘
    IDLE ──redo_validation_now──> REDOING_VALIDATION ──validation_redone──> IDLE
    any ──saving_in_validation──> SAVING_IN_VALIDATION ──saved──> the state before it

``VALIDATION_TO_REDO``: a validation the checkpoint interrupted runs again from its first batch and
starting random state; ``REDOING_VALIDATION``: it (or the one after the saved step) runs, and as it ends
Lightning's validation progress is settled (it counted a batch that never ran). ``load`` is allowed from
any stage; any other transition not drawn raises ``RuntimeError`` (a hook order not known here).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypedDict

from lightning_resume.exact_resume.per_rank_states import RankOwned
from lightning_resume.exact_resume.trainable import Modes


class RankState(TypedDict, total=False):
    """What one rank stores in the checkpoint (``state_dict()["ranks"][i]``): ``draws`` per plain
    loader (:class:`.EpochDraws`), ``metrics`` (:mod:`.epoch_metrics`) and, under DDP, its ``loaders``
    states and ``owned`` scheduler and callback states (:mod:`.per_rank_states`)."""

    rng: dict[str, Any]
    draws: list[Any]
    datasets: list[dict[str, Any]]  # the generators of each plain loader's dataset (:mod:`.data_position`)
    metrics: dict[str, Any] | None
    loaders: list[Any] | None
    owned: RankOwned
    check: dict[str, Any] | None  # the self-check's fingerprint at the save (:mod:`.self_check`)
    grads: list[Any]  # gradients the next step adds to (:mod:`.held_grads`)
    frozen: list[str]  # the parameters without requires_grad (:mod:`.trainable`)
    modes: Modes  # the submodules in eval mode, the norm layers not tracking stats (:mod:`.trainable`)
    workers: list[dict[str, Any] | None]  # each plain loader's persistent workers (.persistent_workers)
    val_log_steps: dict[int, int]  # the step of each validation loader's next logged value


@dataclass(frozen=True)
class Loaded:
    """A checkpoint's states still to be applied: every rank's (by global rank), and whether it was
    written ``mid_epoch`` (``batches`` in), ``in_validation`` (a preemption), ``before_validation`` (at the
    end of a step a validation followed) or ``between_epochs``."""

    ranks: list[RankState]
    mid_epoch: bool
    batches: int
    in_validation: bool = False
    before_validation: bool = False
    between_epochs: bool = False

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Loaded | None:
        """What ``RequeueCheckpoint.state_dict`` saved (``None`` for a state without ranks)."""
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
    """Where an exact resume stands (see the module's docstring)."""

    IDLE = "idle"
    LOADED = "loaded"
    VALIDATION_TO_REDO = "validation to redo"
    REDOING_VALIDATION = "redoing validation"
    SAVING_IN_VALIDATION = "saving in validation"


@dataclass(frozen=True)
class ResumeState:
    """One stage and the data only it has (``loaded``: ``LOADED``; ``rng``, the validation's start:
    ``VALIDATION_TO_REDO``; ``before``: ``SAVING_IN_VALIDATION``); each transition returns a new value."""

    stage: Stage = Stage.IDLE
    loaded: Loaded | None = None
    rng: dict[str, Any] | None = None
    before: ResumeState | None = None

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
