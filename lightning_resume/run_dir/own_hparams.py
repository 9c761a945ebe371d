"""The objects ``save_hyperparameters()`` pickled into the run's own checkpoints, allowed back in.

torch >= 2.6 reads Lightning's ``torch.load(weights_only=None)`` as ``weights_only=True``, which refuses
hyperparameters holding objects (an ``nn.Module``, Hydra's ``functools.partial``): every restart of
such a run would fail. The rule: a load of the run's own checkpoint may unpickle the classes and
functions the module's and data module's ``hparams`` are made of *now* (found by pickling them without
tensor data); anything else stays refused, in one line naming the type and how to allow it. An
explicit ``weights_only`` gets no allowance.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import pickletools
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

#: ``safe_globals`` and ``get_unsafe_globals_in_checkpoint`` exist (torch >= 2.5).
SUPPORTED = hasattr(torch.serialization, "get_unsafe_globals_in_checkpoint")


class _GlobalsPickler(pickle.Pickler):
    """Pickles like ``torch.save`` (protocol 2) but leaves tensor data out: only the names matter."""

    def persistent_id(self, obj: Any) -> str | None:
        if isinstance(obj, torch.storage.TypedStorage) or torch.is_storage(obj):
            return "storage"
        return None


def _resolve(module: str, qualname: str) -> Any | None:
    """The object a pickle's ``GLOBAL module qualname`` names, from modules already imported."""
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found


def hparams_globals(*hparams: Any) -> dict[str, Any]:
    """``{"module.qualname": object}`` for every class and function pickling ``hparams`` refers to
    (none when they cannot be pickled: then no checkpoint holds them either)."""
    buffer = io.BytesIO()
    try:
        _GlobalsPickler(buffer, protocol=2, fix_imports=False).dump(list(hparams))
    except Exception:
        return {}
    found = {}
    for opcode, argument, _ in pickletools.genops(buffer.getvalue()):
        if opcode.name == "GLOBAL" and isinstance(argument, str):
            module, _, qualname = argument.partition(" ")
            obj = _resolve(module, qualname)
            if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
                found[f"{module}.{qualname}"] = obj
    return found


def trainer_hparams_globals(trainer: pl.Trainer) -> dict[str, Any]:
    """:func:`hparams_globals` of the trainer's module and data module."""
    owners = [trainer.lightning_module, getattr(trainer, "datamodule", None)]
    return hparams_globals(*(owner.hparams for owner in owners if owner is not None))


@contextlib.contextmanager
def allowing(allowed: Mapping[str, Any]) -> Iterator[None]:
    """Let ``torch.load(weights_only=True)`` unpickle ``allowed`` inside the block."""
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


def refusal(path: str, error: BaseException, allowed: Mapping[str, Any], owner: str) -> str | None:
    """One line naming the types ``weights_only`` refused in ``path`` beyond ``allowed`` (the
    hyperparameters of ``owner``), or ``None`` if that is not why loading it raised ``error``."""
    if not isinstance(error, pickle.UnpicklingError):
        return None
    refused = [name for name in unsafe_globals(path) if name not in allowed]
    if not refused:
        return None
    listed = ", ".join(refused)
    return (
        f"Cannot load {path!r}: it pickles {listed}, which torch's weights_only load refuses and which "
        f"the hyperparameters of {owner} are not made of. If you trust the file, allow it before fit with "
        f"torch.serialization.add_safe_globals([{listed}]), or pass weights_only=False to the Trainer's "
        "fit/validate/test/predict."
    )


def owner_name(trainer: pl.Trainer) -> str:
    """The trained module's class name, for :func:`refusal`."""
    module = trainer.lightning_module
    return type(module).__name__ if module is not None else "the module"
