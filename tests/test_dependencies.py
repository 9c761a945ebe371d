"""Every module the package imports is declared: in ``dependencies``, or in the extra that needs it.

Read from the import graph of the package's source: an import at the top of a module (run on import)
needs a core dependency; one inside a function (run when a feature is used) may come from an extra.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import lightning_resume

PACKAGE = Path(lightning_resume.__file__).parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"
#: Imported only to match an object the user made with it (a TensorBoard writer of tensorboardX): the
#: user installed it to make that object.
USERS_OWN = {"tensorboardX"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared() -> tuple[set[str], dict[str, set[str]]]:
    import tomllib  # Python 3.11+; make test-pythons collects this module on 3.10 too

    project = tomllib.loads(PYPROJECT.read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = {extra: {_name(r) for r in reqs} for extra, reqs in project["optional-dependencies"].items()}
    return core, extras


def imported() -> dict[str, bool]:
    """Third-party top-level modules imported by the package -> whether some import is at module level."""
    found: dict[str, bool] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top_level = {id(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "lightning_resume":
                    continue
                found[top] = found.get(top, False) or id(node) in top_level
    return found


@functools.cache
def _packages_distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()  # reads every installed distribution: once


def distributions(module: str) -> set[str]:
    """The distributions that provide ``module`` (several for ``mlflow``: ``mlflow``, ``mlflow-skinny``)."""
    names = _packages_distributions().get(module) or [module]
    return {name.lower().replace("_", "-") for name in names}


def test_every_imported_module_is_declared_where_it_is_needed() -> None:
    core, extras = declared()
    optional = set().union(*extras.values())
    problems = []
    for module, at_import in sorted(imported().items()):
        if module in USERS_OWN:
            continue
        dists = distributions(module)
        if at_import and not dists & core:
            problems.append(f"{module} ({dists}) is imported at module level but is not in dependencies")
        elif not dists & (core | optional):
            problems.append(f"{module} ({dists}) is imported but declared nowhere")
    assert not problems, "\n".join(problems)


def test_the_all_extra_holds_every_other_extra() -> None:
    _, extras = declared()
    runtime = set().union(*(reqs for extra, reqs in extras.items() if extra not in ("all", "dev")))
    assert runtime == extras["all"], runtime ^ extras["all"]
