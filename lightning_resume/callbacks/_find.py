"""Find the one callback of a kind in a Trainer, with one wording of ``MissingCallbackError``."""

from __future__ import annotations

from typing import TypeVar

import lightning.pytorch as pl

from lightning_resume.exceptions import MissingCallbackError

T = TypeVar("T")


def missing(needed: str, needed_by: str, why: str, found: int = 0) -> MissingCallbackError:
    """The error for ``needed_by`` without exactly one ``needed`` callback (``why`` it needs one)."""
    todo = f"add {needed}() to the Trainer's callbacks" if found == 0 else "keep one of them"
    return MissingCallbackError(
        f"{needed_by} needs a {needed} callback in the same Trainer ({why}): found {found}, and it needs "
        f"exactly one {needed}; {todo}.",
        needed=needed,
        needed_by=needed_by,
    )


def _of(trainer: pl.Trainer, kind: type[T]) -> list[T]:
    return [cb for cb in trainer.callbacks if isinstance(cb, kind)]  # type: ignore[attr-defined]


def the_one(trainer: pl.Trainer, kind: type[T]) -> T | None:
    """The one callback of ``kind`` among ``trainer.callbacks`` (``None`` unless there is exactly one)."""
    found = _of(trainer, kind)
    return found[0] if len(found) == 1 else None


def find_one(trainer: pl.Trainer, kind: type[T], needed_by: str, why: str) -> T:
    """The one callback of ``kind`` among ``trainer.callbacks``.

    Raises:
        MissingCallbackError: there is none, or more than one.
    """
    found = _of(trainer, kind)
    if len(found) != 1:
        raise missing(kind.__name__, needed_by, why, len(found))
    return found[0]
