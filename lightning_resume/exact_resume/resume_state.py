"""What an exact resume holds between hooks: the saved format, and one state with named transitions.

A checkpoint's states do not all go back at one moment: the random state is restored before the next
epoch's iterator (a checkpoint at an epoch boundary), just before the first resumed batch (mid-epoch),
or as the validation the checkpoint interrupted starts again; and a save from inside a validation
stores that validation's starting random state. :class:`ResumeState` says which is under way::

    IDLE ──load──> LOADED ──applied──> IDLE
                     ├──redo_validation_from(rng)──> VALIDATION_TO_REDO ──redo_validation_now──┐
                     └──redo_validation_now──> REDOING_VALIDATION <─────────────────────────────┘
    IDLE ──redo_validation_now──> REDOING_VALIDATION ──validation_redone──> IDLE
    any ──saving_in_validation──> SAVING_IN_VALIDATION ──saved──> the state before it

- ``IDLE``: nothing loaded waits (a fresh run, or everything was applied).
- ``LOADED``: ``load_state_dict`` gave a checkpoint's states (:class:`Loaded`); each goes back at its moment.
- ``VALIDATION_TO_REDO``: the checkpoint was written inside a validation; the restart runs it again
  from its first batch, restoring the validation's starting random state as it starts.
- ``REDOING_VALIDATION``: that validation (or the one that followed the saved step) runs again; as it
  ends, Lightning's validation progress is settled (it counted a batch as started that never ran).
- ``SAVING_IN_VALIDATION``: a save from inside fit's validation is being written: it stores the
  validation's starting random state and makes the restart run that validation again.

``load`` is allowed from any stage (a new ``fit`` loads again); any other transition from a stage not
drawn above raises ``RuntimeError``: it would be a hook order this module does not know.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypedDict

from lightning_resume.exact_resume.per_rank_states import RankOwned


class RankState(TypedDict, total=False):
    """What one rank stores in the checkpoint (``state_dict()["ranks"][i]``).

    ``draws``: per plain training loader, the random states its current epoch was drawn from
    (:class:`~lightning_resume.exact_resume.data_position.EpochDraws`); ``metrics``: the epoch's metric
    states, logged accumulators and callback metrics (:mod:`.epoch_metrics`); ``loaders``, under
    DDP: this rank's training loader states, which Lightning keeps for the saving rank only, and
    ``owned`` its learning-rate scheduler and callback states (:mod:`.per_rank_states`).
    """

    rng: dict[str, Any]
    draws: list[Any]
    metrics: dict[str, Any] | None
    loaders: list[Any] | None
    owned: RankOwned


@dataclass(frozen=True)
class Loaded:
    """A checkpoint's states, loaded and still to be applied.

    Attributes:
        ranks: Every rank's saved state, by global rank.
        mid_epoch: The checkpoint was written inside an epoch (not at its end).
        between_epochs: The checkpoint was written once an epoch had ended, before the next began.
        batches: Batches of that epoch already consumed.
        in_validation: The checkpoint was written during fit's validation (a preemption).
        before_validation: The checkpoint was written at the end of a step that a validation followed.
    """

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
    """One stage and the data only that stage has; each transition returns a new value.

    Attributes:
        stage: Where the resume stands.
        loaded: The loaded states (``LOADED`` only).
        rng: The random state the validation to redo starts from (``VALIDATION_TO_REDO`` only).
        before: The state to go back to once the save is written (``SAVING_IN_VALIDATION`` only).
    """

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
