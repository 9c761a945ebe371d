"""Directories given by the user: environment variables and ``~`` expanded, or a clear error."""

from __future__ import annotations

import os
import re
from pathlib import Path

_VARIABLE = re.compile(r"\$(\w+)|\$\{([^}]*)\}")


def expand_dir(value: str | os.PathLike[str], what: str) -> Path:
    """``value`` with ``$VAR``/``${VAR}`` and ``~`` expanded, made absolute.

    A variable that is not set raises ``ValueError`` naming it: left as it is, ``"$TMPDIR/ckpt"``
    would become a folder literally called ``$TMPDIR`` in the working directory, and checkpoints
    would land where no restart looks for them.
    """
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
