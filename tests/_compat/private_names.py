"""Find the places where a module reaches into another library's internals (for ``tests/_compat``).

A touch is: an import of a private module or name of Lightning, torch, torchmetrics or torchdata
(a dotted part starting with ``_``); a read or write of a private attribute (``x._name``, also through
``getattr``/``setattr``/``hasattr``/``__dict__``) that is not a name of this package's own; a method of
theirs replaced or deleted on an object (``strategy.load_checkpoint = ...``), or the Trainer's callback
list reassigned; a warnings filter on their messages; and a walk of the call stack into their frames.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FOREIGN = ("lightning", "pytorch_lightning", "lightning_fabric", "torch", "torchmetrics", "torchdata")
#: Data attributes of theirs whose reassignment counts as a patch (not a public setting).
PATCHED_ATTRIBUTES = frozenset({"callbacks"})


@dataclass(frozen=True)
class Touch:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _foreign_module(module: str) -> bool:
    return module.split(".")[0] in FOREIGN


@cache
def foreign_methods() -> frozenset[str]:
    """The public method names of the classes our code patches into: Lightning's Trainer, strategies,
    callbacks, modules, loggers and plugins, torch's data loading classes and modules."""
    import lightning.pytorch as pl
    from lightning.fabric.plugins import CheckpointIO
    from lightning.pytorch import loggers, strategies
    from torch.utils import data

    classes: list[type] = [pl.Trainer, pl.LightningModule, pl.Callback, pl.LightningDataModule, CheckpointIO]
    classes += [c for _, c in inspect.getmembers(strategies, inspect.isclass)]
    classes += [c for _, c in inspect.getmembers(loggers, inspect.isclass)]
    classes += [data.DataLoader, data.Sampler, data.Dataset, data.BatchSampler]
    names = set()
    for cls in classes:
        for name, value in inspect.getmembers(cls):
            if not name.startswith("_") and (inspect.isfunction(value) or inspect.ismethoddescriptor(value)):
                names.add(name)
    return frozenset(names)


def own_private_names(files: list[Path]) -> frozenset[str]:
    """Every private name this package defines: functions, classes, attributes set on ``self``/``cls``
    or in class bodies, module-level names, parameters and import aliases."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)  # dataclasses.replace(x, _field=...), constructor keywords
    return frozenset(n for n in names if _private(n))


def _string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _called(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def touches(path: Path, shown: str, own: frozenset[str]) -> Iterator[Touch]:
    """Every touch of another library's internals in one source file."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if _foreign_module(node.module) and any(_private(part) for part in node.module.split(".")):
                yield Touch(shown, line, f"imports private module {node.module}")
            for alias in node.names:
                if _foreign_module(node.module) and _private(alias.name):
                    yield Touch(shown, line, f"imports private name {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _foreign_module(alias.name) and any(_private(p) for p in alias.name.split(".")):
                    yield Touch(shown, line, f"imports private module {alias.name}")
        elif isinstance(node, ast.Attribute):
            receiver = ast.unparse(node.value)
            mine = receiver in ("self", "cls")
            theirs = _foreign_module(receiver) or receiver == "super()"  # torch.serialization._save
            if _private(node.attr) and not mine and (theirs or node.attr not in own):
                yield Touch(shown, line, f"private attribute {receiver}.{node.attr}")
            patched = node.attr in foreign_methods() or node.attr in PATCHED_ATTRIBUTES
            if isinstance(node.ctx, (ast.Store, ast.Del)) and patched and not mine:
                yield Touch(shown, line, f"replaces or deletes {receiver}.{node.attr}")
        elif isinstance(node, ast.Call):
            name = _called(node.func)
            if name in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2:
                text = _string(node.args[1])
                if text is not None and _private(text) and text not in own:
                    yield Touch(shown, line, f"{name}(..., {text!r})")
            texts = any(k.arg in ("message", "module") for k in node.keywords)
            if name in ("filterwarnings", "simplefilter") and texts:
                yield Touch(shown, line, "a warnings filter on message texts")
            if name in ("_getframe", "currentframe", "stack"):
                yield Touch(shown, line, "a walk of the call stack")
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith(".__dict__"):
            text = _string(node.slice)
            if text is not None and _private(text) and text not in own:
                yield Touch(shown, line, f"__dict__[{text!r}]")


def package_touches(package: Path, allowed: str = "_compat") -> list[Touch]:
    """Every touch outside ``package/allowed``."""
    files = sorted(package.rglob("*.py"))
    own = own_private_names(files)
    found: list[Touch] = []
    for path in files:
        relative = path.relative_to(package.parent)
        if relative.parts[1] == allowed:
            continue
        found.extend(touches(path, str(relative), own))
    return found


def private_overrides(module_name: str) -> list[Touch]:
    """Private methods of another library's class that a class of ``module_name`` overrides."""
    import importlib

    module = importlib.import_module(module_name)
    found = []
    for cls in vars(module).values():
        if not inspect.isclass(cls) or cls.__module__ != module_name:
            continue
        foreign = [b for b in cls.__mro__[1:] if _foreign_module(b.__module__)]
        for name, value in vars(cls).items():
            code = inspect.isfunction(value) or isinstance(value, (property, staticmethod, classmethod))
            if code and _private(name) and any(name in vars(base) for base in foreign):
                what = f"{cls.__name__} overrides {foreign[0].__name__}.{name}"
                found.append(Touch(module_name, inspect.getsourcelines(cls)[1], what))
    return found
