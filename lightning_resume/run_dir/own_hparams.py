"""What a load of the run's own checkpoints may unpickle beyond torch's ``weights_only`` set: the kinds each
save of ``last.ckpt`` recorded in ``saves.json`` (:func:`census`), and the module's ``hparams`` kinds."""

from __future__ import annotations

import contextlib
import copyreg
import importlib
import io
import pickle
import types
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_resume._warnings import warn
from lightning_resume.run_dir import save_record

#: ``safe_globals`` and ``get_unsafe_globals_in_checkpoint`` exist (torch >= 2.5).
SUPPORTED = hasattr(torch.serialization, "get_unsafe_globals_in_checkpoint")

#: What the census pickles for every tensor and storage: a storage id ``torch.load`` reads as an empty
#: storage from :func:`_archive`'s one record (tensor data never matters for what a pickle names).
_STUB = ("storage", torch.UntypedStorage, "0", "cpu", 0)


def _kind(obj: Any, name: str | None = None) -> str:
    """``module:qualname`` of a class or function, as the pickle names it (``name``: its reduce string)."""
    name = name or getattr(obj, "__qualname__", None) or obj.__name__
    return f"{pickle.whichmodule(obj, name)}:{name}"  # type: ignore[attr-defined]


class _Census(pickle.Pickler):
    """Pickles like ``torch.save`` (protocol 2), tensor data left out, noting the kinds it names."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=2)
        self.kinds: set[str] = set()

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if type(obj) not in (torch.Tensor, torch.nn.Parameter):
                self.kinds.add(_kind(type(obj)))  # rebuilt by torch from its named class
            return _STUB
        return _STUB if isinstance(obj, (torch.UntypedStorage, torch.storage.TypedStorage)) else None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)):
            self.kinds.add(_kind(obj))
            return NotImplemented
        reduce = copyreg.dispatch_table.get(type(obj))
        value: Any = reduce(obj) if reduce is not None else obj.__reduce_ex__(2)
        if isinstance(value, str):  # a builtin or C function, pickled by name
            self.kinds.add(_kind(obj, value))
            return NotImplemented
        if len(value) > 2 and value[2] is not None:
            self.kinds.add(_kind(type(obj)))  # its state is set on it: weights_only checks its class
        return value


def census(checkpoint: Any) -> tuple[bytes, frozenset[str]] | None:
    """The pickle of ``checkpoint`` without tensor data, and the kinds it names (``None``: unpicklable)."""
    buffer = io.BytesIO()
    pickler = _Census(buffer)
    try:
        pickler.dump(checkpoint)
    except Exception:
        return None
    return buffer.getvalue(), frozenset(pickler.kinds - {_kind(torch.UntypedStorage)})


def resolve(kind: str) -> Any:
    """The class or function ``module:qualname`` names, its module imported."""
    module, _, qualname = kind.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _resolved(kinds: frozenset[str]) -> dict[str, Any]:
    """``{"module.qualname": (object, name)}`` for the ``kinds`` that import (for ``safe_globals``)."""
    found = {}
    for kind in kinds:
        with contextlib.suppress(Exception):
            name = kind.replace(":", ".", 1)
            found[name] = (resolve(kind), name)
    return found


def recorded_globals(run_dir: Path) -> dict[str, Any]:
    """What the run's saves recorded (:func:`_resolved`): what a restart's load may unpickle."""
    return _resolved(save_record.read(run_dir).pickled)


def _archive(data: bytes) -> io.BytesIO:
    """A ``torch.save`` archive of the census pickle ``data``: its storages all one empty record."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in (("data.pkl", data), ("byteorder", b"little"), ("version", b"3\n")):
            archive.writestr(f"archive/{name}", content)
        archive.writestr("archive/data/0", b"")
    buffer.seek(0)
    return buffer


def unreadable(data: bytes, kinds: frozenset[str], allowed: Mapping[str, Any]) -> str | None:
    """Why ``weights_only`` with ``kinds`` and ``allowed`` cannot load census ``data`` (``None``: it can)."""
    found = _resolved(kinds)
    missing = sorted(name for name in (k.replace(":", ".", 1) for k in kinds) if name not in found)
    if missing:
        return f"it pickles {', '.join(missing)}, which cannot be imported by that name"
    try:
        with allowing({**allowed, **found}):
            torch.load(_archive(data), weights_only=True)
    except Exception as e:
        detail = e.__context__ or e  # torch raises the unpickler's reason inside its own long message
        return f"torch's weights_only load refuses it ({type(detail).__name__}: {str(detail).strip()})"
    return None


class SavedPickles:
    """Record each ``last.ckpt`` save's kinds (rank 0); warn once if a restart could not load it."""

    def __init__(self, run_dir: Callable[[], Path]) -> None:
        self._run_dir = run_dir
        self._checked: frozenset[str] | None = None
        self._warned = False

    def saving(self, trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
        if not SUPPORTED or not trainer.is_global_zero:
            return
        found = census(checkpoint)
        if found is None:
            return
        data, kinds = found
        record = save_record.update(self._run_dir(), pickled=kinds)
        if kinds == self._checked or self._warned:
            return
        self._checked = kinds
        why = unreadable(data, record.pickled, {})
        if why is not None:
            self._warned = True
            warn(
                f"A restart could not load last.ckpt as saved at step {trainer.global_step}: {why}. Keep "
                "such objects out of the checkpoint (its hyperparameters and on_save_checkpoint), or pass "
                "weights_only=False to fit() if you trust the run's own files."
            )


# -- the hyperparameters the module holds now ----------------------------------------------------------


def hparams_globals(*hparams: Any) -> dict[str, Any]:
    """:func:`_resolved` kinds that pickling ``hparams`` names (none when they cannot be pickled)."""
    found = census(list(hparams))
    return _resolved(found[1]) if found is not None else {}


def own_globals(trainer: pl.Trainer, run_dir: Path) -> dict[str, Any]:
    """What a load of a file of the run may unpickle: the kinds its saves recorded, and the hparams'."""
    owners = [trainer.lightning_module, getattr(trainer, "datamodule", None)]
    hparams = hparams_globals(*(owner.hparams for owner in owners if owner is not None))
    return {**hparams, **recorded_globals(run_dir)}


# -- the load ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def allowing(allowed: Mapping[str, Any]) -> Iterator[None]:
    """Let ``torch.load(weights_only=True)`` unpickle ``allowed`` (objects, or ``(object, name)``) inside."""
    # torch's context removes on exit what it added, also what the user had allowed before: skip those.
    already = set(torch.serialization.get_safe_globals()) if SUPPORTED else set()
    extra = [obj for obj in allowed.values() if obj not in already]
    with torch.serialization.safe_globals(extra) if extra else contextlib.nullcontext():
        yield


def unsafe_globals(path: str | Path) -> list[str]:
    """What the checkpoint file ``path`` pickles that ``weights_only`` refuses (empty when unknown)."""
    if not SUPPORTED or not Path(path).is_file():
        return []
    try:
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    except Exception:  # not a torch zip file (damaged, or another format): the load says what it is
        return []


def load(
    original: Callable[..., dict[str, Any]],
    path: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    allowed: Callable[[], Mapping[str, Any]],
) -> dict[str, Any]:
    """``original(path, *args, **kwargs)`` with the rule applied (``allowed``: the types it allows)."""
    if not SUPPORTED or kwargs.get("weights_only") is not None:
        return original(path, *args, **kwargs)
    with allowing(allowed()):
        return original(path, *args, **kwargs)


def refusal(
    path: str, error: BaseException, allowed: Mapping[str, Any], owner: str | None = None
) -> str | None:
    """The line naming what ``weights_only`` refused in ``path`` beyond ``allowed`` (``None``: not why)."""
    if not isinstance(error, pickle.UnpicklingError):
        return None
    refused = [name for name in unsafe_globals(path) if name not in allowed]
    if not refused:
        return None
    listed = ", ".join(refused)
    hparams = f" and which the hyperparameters of {owner} are not made of" if owner else ""
    return (
        f"Cannot load {path!r}: it pickles {listed}, which torch's weights_only load refuses and which no "
        f"save of this run recorded (saves.json in its run dir){hparams}. If you trust the file, allow it "
        "before fit with "
        f"torch.serialization.add_safe_globals([{listed}]), or pass weights_only=False to the Trainer's "
        "fit/validate/test/predict."
    )
