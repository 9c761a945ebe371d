"""Checks of what a user gives, in one wording. A ``bool`` is never a count or a number of seconds:
every check refuses it. Wrong types raise ``TypeError``, bad values ``ValueError``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lightning_resume.exceptions import MissingCallbackError

if TYPE_CHECKING:
    import lightning.pytorch as pl

T = TypeVar("T")
_VARIABLE = re.compile(r"\$(\w+)|\$\{([^}]*)\}")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole_number(name: str, value: Any, minimum: int | None = None, what: str = "whole number") -> int:
    """``value`` if it is a whole number (at least ``minimum``), else ``TypeError`` or ``ValueError``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be a {what}, got {value!r}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}.")
    return int(value)


def positive_number(name: str, value: Any, what: str = "number") -> float:
    """``value`` if it is a number greater than zero, else ``TypeError`` or ``ValueError`` (NaN too)."""
    if not is_number(value):
        raise TypeError(f"{name} must be a {what}, got {value!r}.")
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}.")
    return float(value)


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return value


def expand_dir(value: str | os.PathLike[str], what: str) -> Path:
    """``value`` with ``$VAR``/``${VAR}`` and ``~`` expanded, made absolute (``ValueError``: one is unset)."""
    text = os.fspath(value)
    expanded = os.path.expandvars(text)
    unset = sorted({a or b for a, b in _VARIABLE.findall(expanded)})
    if unset:
        names = ", ".join(f"${name}" for name in unset)
        raise ValueError(
            f"{what} {text!r} uses {names}, which is not set in this process's environment: set it "
            "before the job starts (e.g. in the batch script), or give a path without it."
        )
    return Path(expanded).expanduser().absolute()


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
    """The one callback of ``kind`` among ``trainer.callbacks``, else ``MissingCallbackError``."""
    found = _of(trainer, kind)
    if len(found) != 1:
        raise missing(kind.__name__, needed_by, why, len(found))
    return found[0]
