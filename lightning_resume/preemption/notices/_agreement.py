"""The ranks' side of notices: agree on one act and share the notice acted on (only polling ranks see
notices, but every rank acts at the same step). All ranks call these at the same batch: collectives."""

from __future__ import annotations

from lightning.pytorch.strategies import Strategy

from lightning_resume._collectives import gather_objects, max_over_ranks
from lightning_resume.io._protocol import HurryingCheckpointIO
from lightning_resume.preemption.notices._notice import Notice
from lightning_resume.preemption.notices._policy import Act

#: What a rank wants at a check, and the notice that asks for it.
Wanted = tuple[Act, "Notice | None"]


def agree(strategy: Strategy, wanted: Act) -> Act:
    """The most urgent act any rank wants (a signal, then a notice's stop, then a notice's save)."""
    return Act(max_over_ranks(strategy, int(wanted)))


def shared_notice(strategy: Strategy, wanted: Wanted, agreed: Act) -> Notice:
    """The notice of the first rank that wanted ``agreed`` (a notice's save or stop), on every rank."""
    for act, notice in gather_objects(strategy, wanted):
        if act == agreed and notice is not None:
            return notice
    raise RuntimeError(f"the ranks agreed on {agreed.name} for a notice, but no rank has one")


def written_seconds(checkpoint_io: object) -> float | None:
    """Seconds the checkpoint plugin's newest save took to be written, if the plugin says."""
    write = checkpoint_io.last_write if isinstance(checkpoint_io, HurryingCheckpointIO) else None
    return write.seconds if write is not None else None
