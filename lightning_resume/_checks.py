"""Constructor-argument checks, one wording for every public class.

A ``bool`` is an ``int`` to Python but never a count or a number of seconds to a user, so every check
refuses it. Type errors raise ``TypeError`` and out-of-range values ``ValueError``, both naming the
argument and the value with ``!r``.

Pure standard library.
"""

from __future__ import annotations

from typing import Any


def is_whole_number(value: Any) -> bool:
    """Whether ``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is an ``int`` or a ``float`` and not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole_number(name: str, value: Any, minimum: int | None = None, what: str = "whole number") -> int:
    """``value`` if it is a whole number (at least ``minimum``).

    Raises:
        TypeError: not a whole number (``"<name> must be a <what>, got ..."``).
        ValueError: below ``minimum`` (``"<name> must be >= <minimum>, got ..."``).
    """
    if not is_whole_number(value):
        raise TypeError(f"{name} must be a {what}, got {value!r}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}.")
    return int(value)


def positive_number(name: str, value: Any, what: str = "number") -> float:
    """``value`` if it is a number greater than zero.

    Raises:
        TypeError: not a number (``"<name> must be a <what>, got ..."``).
        ValueError: zero, negative or NaN (``"<name> must be > 0, got ..."``).
    """
    if not is_number(value):
        raise TypeError(f"{name} must be a {what}, got {value!r}.")
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}.")
    return float(value)


def flag(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False``.

    Raises:
        TypeError: anything else.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return value
