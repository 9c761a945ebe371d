"""The objects ``save_hyperparameters()`` pickled into the run's own checkpoints, allowed back in.

Lightning loads checkpoints with ``torch.load(weights_only=None)``, which torch >= 2.6 reads as
``weights_only=True``: a checkpoint whose ``hyper_parameters`` hold objects (an ``nn.Module`` given
to the module's ``__init__``, a ``functools.partial`` optimizer, as Hydra's ``_partial_`` makes) is
refused with ``UnpicklingError`` ("Unsupported global"), and so is every restart of such a run.

The rule: a load of the run's own checkpoint (the one a restart resumes from, or one of the run's
files that ``validate``/``test``/``predict`` is given) may unpickle the classes and functions that
the trained module's and data module's hyperparameters are made of *now*: the ones this process
built from its own code and configuration, found by pickling ``hparams`` (without tensor data).
Any other type stays refused, and the refusal is one line naming the type and the two ways to
allow it. ``weights_only=False`` needs nothing; an explicit ``weights_only=True`` gets no allowance.
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

#: ``torch.serialization.safe_globals`` and ``get_unsafe_globals_in_checkpoint`` exist (torch >= 2.5).
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
    """``{"module.qualname": object}`` for every class and function pickling ``hparams`` refers to.

    Empty when they cannot be pickled (then no checkpoint holds them either).
    """
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
    if not extra:
        yield
        return
    with torch.serialization.safe_globals(extra):
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
    """One line saying which types ``weights_only`` refused in ``path``, or ``None`` if that is not why
    loading it raised ``error``.

    Args:
        path: The checkpoint that failed to load.
        error: What loading it raised.
        allowed: What the rule allowed.
        owner: The module whose hyperparameters were allowed (for the message).
    """
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
