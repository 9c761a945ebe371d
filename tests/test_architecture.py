"""The claims of ``docs/src/architecture.md``, checked: layers, no import cycle, a torch-free bottom layer
and command line, and the few packages ``RequeueCheckpoint`` reaches (the ``_compat`` seam is
``tests/_compat/test_seam.py``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import lightning_resume

PACKAGE = Path(lightning_resume.__file__).parent
NAME = "lightning_resume"
#: Each part of the package and its layer: a part imports only from lower layers.
LAYERS = {
    "exceptions": 0,
    "_version": 0,
    "_checks": 1,
    "_warnings": 1,
    "_log": 1,
    "_collectives": 1,
    "_storage": 2,
    "_scheduler": 2,
    "_writer": 3,
    "_compat": 3,
    "run_dir": 4,
    "exact_resume": 4,
    "io": 4,
    "last_ckpt": 5,
    "trackers": 5,
    "preemption": 6,
    "watchdog": 7,
    "cli": 8,
    # The faces of the package: what users import.
    "__init__": 9,
    "__main__": 9,
    "notices": 9,
    "loggers": 9,
    "pytorch_lightning": 9,
    "_standalone": 8,
}
BASICS = {"exceptions", "_version", "_checks", "_warnings", "_log", "_collectives"}
HEAVY = ("torch", "lightning", "lightning_fabric", "pytorch_lightning", "numpy")


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _runtime_imports(tree: ast.Module) -> Iterator[ast.ImportFrom | ast.Import]:
    """Every import statement, blocks under ``if TYPE_CHECKING:`` left out."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    for node in ast.walk(tree):
        if isinstance(node, (ast.ImportFrom, ast.Import)) and id(node) not in skipped:
            yield node


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (a name imported from a package counts as its module)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith(NAME)]
            elif node.module and node.module.startswith(NAME) and not node.level:
                targets = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t if t in modules else node.module for t in targets]
            else:
                continue
            graph[name].update(t for t in targets if t != name)
    return graph


def test_every_part_has_a_layer() -> None:
    parts = {_part(_module(p)) for p in PACKAGE.rglob("*.py")}
    assert parts == set(LAYERS), parts ^ set(LAYERS)


def test_each_part_imports_only_from_lower_layers() -> None:
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in import_graph().items()
        for target in targets
        if _part(source) != _part(target) and LAYERS[_part(target)] >= LAYERS[_part(source)]
    )
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_cycle() -> None:
    graph, state, cycles = import_graph(), {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def test_requeue_checkpoint_reaches_few_packages() -> None:
    module = f"{NAME}.last_ckpt.requeue_checkpoint"
    parts = {_part(t) for t in import_graph()[module]} - BASICS - {"last_ckpt"}
    assert len(parts) <= 4, parts


def test_the_bottom_layer_and_the_command_line_import_neither_torch_nor_lightning() -> None:
    # A bare package object, as the writer's entry script makes: lightning_resume/__init__ is not run.
    code = f"""
import importlib, pkgutil, sys, types
package = types.ModuleType({NAME!r})
package.__path__ = [{str(PACKAGE)!r}]
sys.modules[{NAME!r}] = package
names = []
for part in ("_storage", "_writer", "_scheduler"):
    found = importlib.import_module({NAME!r} + "." + part)
    names += [part + "." + m.name for m in pkgutil.iter_modules(found.__path__) if m.name != "main"]
names += ["cli", "cli.gc", "cli.inspect", "cli.doctor", "cli.report", "cli.render"]
for name in names:
    importlib.import_module({NAME!r} + "." + name)
print(len(names), sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    count, heavy = out.split(" ", 1)
    assert int(count) >= 20 and heavy.strip() == "[]", out
