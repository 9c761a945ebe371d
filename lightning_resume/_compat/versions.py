"""The versions of the libraries whose internals ``_compat`` touches: the lowest declared (CI's
``make test-edge``) and the newest the pins passed on. Torch-free."""

from __future__ import annotations

import importlib.metadata
import re

#: distribution -> (lowest declared, newest tested).
TESTED = {
    "lightning": ("2.5.0", "2.6.6"),
    "pytorch-lightning": ("2.5.0", "2.6.6"),
    "torch": ("2.5.0", "2.13.0"),
}
#: Python (lowest declared, newest tested): pyproject.toml's requires-python and classifiers, the Pythons
#: ``make test-pythons`` runs the exactness core on.
PYTHON = ("3.10", "3.13")


def _numbers(version: str) -> tuple[int, ...]:
    """``"2.5.0.post0"`` -> ``(2, 5, 0)``: the release numbers, for comparing."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _outside(shown: str, numbers: tuple[int, ...], lowest: str, newest: str) -> str | None:
    if numbers < _numbers(lowest):
        return f"{shown} is older than the lowest supported, {lowest}"
    if numbers > _numbers(newest):
        return f"{shown} is newer than the newest tested, {newest}"
    return None


def untested(distribution: str) -> str | None:
    """Why the installed ``distribution`` is outside what was tested (``None`` when inside)."""
    version = installed(distribution)
    if version is None or distribution not in TESTED:
        return None
    return _outside(f"{distribution} {version}", _numbers(version), *TESTED[distribution])


def untested_python(version: tuple[int, ...]) -> str | None:
    """Why Python ``version`` (``sys.version_info``) is outside the tested range (``None`` when inside)."""
    return _outside(f"Python {'.'.join(map(str, version[:3]))}", version[:2], *PYTHON)
