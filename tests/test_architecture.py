"""The claims of ``docs/src/architecture.md``, checked: layers, no import cycle, a torch-free bottom layer
and command line, the few packages ``RequeueCheckpoint``'s folder reaches, and features that meet through
named protocols, never another's private names (the ``_compat`` seam is ``tests/_compat/test_seam.py``)."""

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
    "failure_classes": 0,
    "_checks": 1,
    "_warnings": 1,
    "_log": 1,
    "_collectives": 1,
    "_storage": 2,
    "_scheduler": 2,
    "_compat": 3,
    "run_dir": 4,
    "exact_resume": 4,
    "io": 4,
    "trackers": 5,
    "straggler": 5,
    "exit_status": 5,
    "last_ckpt": 6,  # RequeueCheckpoint puts a LocalLoggerResume (trackers) in
    "preemption": 7,
    "watchdog": 8,
    "cli": 9,
    # The faces of the package: what users import.
    "__init__": 10,
    "__main__": 10,
    "notices": 10,
    "loggers": 10,
    "pytorch_lightning": 10,
    "_standalone": 9,
}
BASICS = {"exceptions", "_version", "failure_classes", "_checks", "_warnings", "_log", "_collectives"}
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


#: What ``RequeueCheckpoint``'s folder imports besides itself and the basics: 4 features, 3 parts below.
LAST_CKPT_REACHES = {"run_dir", "exact_resume", "io", "trackers", "_compat", "_storage", "_scheduler"}


def test_requeue_checkpoint_reaches_few_packages() -> None:
    reached = {
        _part(target)
        for source, targets in import_graph().items()
        if _part(source) == "last_ckpt"
        for target in targets
    }
    assert reached - BASICS - {"last_ckpt"} <= LAST_CKPT_REACHES, reached


#: The feature folders: what a user would name (below the faces, above ``_compat``).
FEATURES = {name for name, layer in LAYERS.items() if 4 <= layer <= 9 and (PACKAGE / name).is_dir()}
#: The named protocols of a feature that other features may import (private to users).
PROTOCOLS = {f"{NAME}.io._protocol"}
#: Underscore names a feature still uses of another's, each a contract written nowhere yet; remove each
#: entry with its last use (a stale entry fails too).
KNOWN: set[tuple[str, str]] = set()  # (folder, what it reaches): none today


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.Module) -> set[str]:
    """The names a module defines: functions, classes, assigned names and attributes."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
    return found


def _foreign_privates(tree: ast.Module, own: str, defined: dict[str, set[str]]) -> Iterator[tuple[int, str]]:
    """``(line, name)`` of each underscore attribute of another feature's object (``self._x`` and names
    of the module's own folder are fine), and of each private module or name imported from another."""
    outside = set()  # names bound to other libraries' modules and objects (os._exit is not ours)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                if not (module or alias.name).startswith(NAME):
                    outside.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in defined[own]:
            base = node.value
            if isinstance(base, ast.Name) and base.id in {"self", "cls", *outside}:
                continue
            if any(node.attr in names for feature, names in defined.items() if feature != own):
                yield node.lineno, node.attr
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"{NAME}."):
            parts = node.module.split(".")
            if parts[1] in FEATURES and parts[1] != own and node.module not in PROTOCOLS:
                if any(_private(part) for part in parts[2:]):
                    yield node.lineno, node.module
                yield from ((node.lineno, a.name) for a in node.names if _private(a.name))


def test_no_feature_uses_another_features_private_names() -> None:
    trees = {p: ast.parse(p.read_text()) for f in FEATURES for p in (PACKAGE / f).rglob("*.py")}
    defined: dict[str, set[str]] = defaultdict(set)
    for path, tree in trees.items():
        defined[path.relative_to(PACKAGE).parts[0]] |= _defined(tree)
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path, tree in trees.items():
        own = path.relative_to(PACKAGE).parts[0]
        for line, name in _foreign_privates(tree, own, defined):
            found[(own, name)].append(f"{path.relative_to(PACKAGE)}:{line}")
    unknown = {key: where for key, where in found.items() if key not in KNOWN}
    assert not unknown, f"use a named protocol (architecture.md) instead: {unknown}"
    assert not KNOWN - set(found), f"no longer used: remove from KNOWN: {KNOWN - set(found)}"


def test_the_bottom_layer_and_the_command_line_import_neither_torch_nor_lightning() -> None:
    # A bare package object, as the writer's entry script makes: lightning_resume/__init__ is not run.
    code = f"""
import importlib, pkgutil, sys, types
package = types.ModuleType({NAME!r})
package.__path__ = [{str(PACKAGE)!r}]
sys.modules[{NAME!r}] = package
names = []
for part in ("_storage", "_scheduler"):
    found = importlib.import_module({NAME!r} + "." + part)
    names += [part + "." + m.name for m in pkgutil.iter_modules(found.__path__)]
names += ["cli", "cli.gc", "cli.inspect", "cli.doctor", "cli.emit", "cli.report", "cli.render"]
for name in names:
    importlib.import_module({NAME!r} + "." + name)
print(len(names), sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    count, heavy = out.split(" ", 1)
    assert int(count) >= 20 and heavy.strip() == "[]", out


def test_the_io_folder_is_internal_and_the_face_exports_the_plugin_and_its_records() -> None:
    import lightning_resume.io as io

    assert not hasattr(io, "__all__") and not hasattr(io, "__getattr__")  # nothing to import from it
    public = {"DurableCheckpointIO", "Mirror", "MemoryTier", "CheckpointSettings", "Restore", "WriteStats"}
    assert public <= set(lightning_resume.__all__)
