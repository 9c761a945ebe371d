"""``lightning_resume`` again on the standalone ``pytorch_lightning`` (whose Trainer checks its own classes):
a finder serves each module rewritten, but ``exceptions``: one module for both, one ``except`` for both."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

SOURCE = Path(__file__).resolve().parent
PACKAGE = "lightning_resume.pytorch_lightning"
#: Modules both packages share (the same module object).
SHARED = frozenset({"exceptions"})
_REWRITES = (
    (re.compile(r"\blightning\.pytorch\b"), "pytorch_lightning"),
    (re.compile(r"\blightning\.fabric\b"), "lightning_fabric"),
    # Dotted references only: the bare name (a logger's or an origin's) stays what it is.
    (re.compile(r"\blightning_resume\.(?!pytorch_lightning\b)"), f"{PACKAGE}."),
)


def rewrite(source: str) -> str:
    """``source`` with Lightning's unified package names replaced by the standalone ones."""
    for pattern, replacement in _REWRITES:
        source = pattern.sub(replacement, source)
    return source


class _Loader(importlib.machinery.SourceFileLoader):
    """Loads a module of ``lightning_resume`` from its file, rewritten."""

    def get_data(self, path: str) -> bytes:
        return rewrite(Path(path).read_text()).encode()

    def path_stats(self, path: str) -> Any:
        raise OSError("no bytecode cache: the cache would hold the unrewritten module")


class _Shared(importlib.abc.Loader):
    """Serves the module of ``lightning_resume`` itself under the mirrored name."""

    def __init__(self, original: str) -> None:
        self.original = original

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.original)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its own name


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``lightning_resume.pytorch_lightning.<module>`` in the source of ``lightning_resume``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(f"{PACKAGE}."):
            return None
        name = fullname[len(PACKAGE) + 1 :]
        parts = name.split(".")
        if parts[0] in ("pytorch_lightning", "_standalone"):
            return None
        if name in SHARED:
            return importlib.machinery.ModuleSpec(fullname, _Shared(f"lightning_resume.{name}"))
        base = SOURCE.joinpath(*parts)
        if (base / "__init__.py").is_file():
            file, package = base / "__init__.py", True
        elif base.with_suffix(".py").is_file():
            file, package = base.with_suffix(".py"), False
        else:
            return None
        loader = _Loader(fullname, str(file))
        return importlib.util.spec_from_file_location(
            fullname, file, loader=loader, submodule_search_locations=[str(base)] if package else None
        )


def install() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def public_names(namespace: dict[str, Any]) -> list[str]:
    """Run ``lightning_resume/__init__.py``, rewritten, in ``namespace``; return its ``__all__``."""
    init = SOURCE / "__init__.py"
    exec(compile(rewrite(init.read_text()), str(init), "exec"), namespace)
    return list(namespace["__all__"])
