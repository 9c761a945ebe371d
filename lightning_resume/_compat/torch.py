"""Every touch of torch's internals (and of the standard library's around its processes), one named
function each, pinned by ``tests/_compat/test_torch.py``."""

from __future__ import annotations

import inspect
import pickle
import random
import sys
from collections.abc import Callable
from types import FrameType, SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from lightning_resume._compat import torchdata
from lightning_resume.failure_classes import FailureClass

#: torch's DataLoader worker loop: the target of every worker process it starts.
WORKER_LOOP = ("torch.utils.data._utils.worker", "_worker_loop")


def torch_records_supported() -> bool:
    """Whether the installed torch has the serialiser entry point :func:`record_torch_save` uses."""
    save = getattr(torch.serialization, "_save", None)
    expected = ["obj", "zip_file", "pickle_module", "pickle_protocol", "_disable_byteorder_record"]
    return save is not None and list(inspect.signature(save).parameters)[:5] == expected


def record_torch_save(obj: Any, write_record: Callable[[str, Any, int], None]) -> None:
    """Run torch's serialiser (``torch.serialization._save``) on ``obj``, each record to ``write_record``."""
    sink = SimpleNamespace(write_record=write_record)  # all torch calls on its zip writer
    torch.serialization._save(obj, sink, pickle, torch.serialization.DEFAULT_PROTOCOL, False)


def iterator_factory(loader: DataLoader) -> Callable[[], Any]:
    """What ``iter(loader)`` calls to make an epoch's iterator (``DataLoader._get_iterator``)."""
    return loader._get_iterator


def replace_iterator_factory(loader: DataLoader, factory: Callable[[], Any]) -> None:
    """Make ``iter(loader)`` call ``factory()`` for its iterators (an instance attribute)."""
    loader._get_iterator = factory  # type: ignore[method-assign]


def replaced_iterator_factory(loader: DataLoader) -> Any:
    """What :func:`replace_iterator_factory` gave ``loader`` (``None`` when nothing)."""
    return loader.__dict__.get("_get_iterator")


def dispatched_batches(loader: DataLoader) -> int | None:
    """Batches of this epoch a loader handed its persistent workers: its iterator's ``_send_idx`` or None."""
    iterator = loader.__dict__.get("_iterator")
    found = getattr(iterator, "_send_idx", None)
    return int(found) if found is not None else None


def end_persistent_workers(loader: DataLoader) -> None:
    """End a loader's persistent workers: the next ``iter()`` starts new ones (current ``worker_init_fn``)."""
    iterator = loader.__dict__.get("_iterator")
    if iterator is not None:
        iterator._shutdown_workers()
        loader._iterator = None


def seed_as_worker(base_seed: int, worker_id: int) -> None:
    """Seed this process's generators as torch's ``_worker_loop`` seeds DataLoader worker ``worker_id``."""
    from torch.utils.data._utils.worker import _generate_state

    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(_generate_state(base_seed, worker_id))


def is_worker_loop(target: Any) -> bool:
    """Whether ``target`` is torch's (or torchdata's) DataLoader worker loop."""
    where = (getattr(target, "__module__", None), getattr(target, "__name__", None))
    return where in (WORKER_LOOP, torchdata.WORKER_LOOP)


def forked_target() -> Any:
    """The ``target`` of the ``multiprocessing.Process`` being forked (call from an at-fork hook):
    ``popen_fork.Popen._launch`` holds it as ``process_obj`` in a frame up the forking thread."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return None
        process = frame.f_locals.get("process_obj")
        if process is not None:
            return getattr(process, "_target", None)
        frame = frame.f_back
    return None


#: Texts of torch's (gloo's, NCCL's) error messages that tell a failure class, lower-cased, checked in order.
FAILURE_TEXTS: tuple[tuple[FailureClass, tuple[str, ...]], ...] = (
    (FailureClass.OUT_OF_MEMORY, ("out of memory", "can't allocate memory")),
    (FailureClass.NON_FINITE, ("returned nan values", "is non-finite")),
    (
        FailureClass.COMMUNICATION,
        (
            *("connection closed by peer", "connection reset by peer", "timed out waiting", "gloo/transport"),
            *("collective operation timeout", "nccl error", "ncclremoteerror", "processgroupnccl"),
        ),
    ),
    (FailureClass.DATA, ("in dataloader worker process", "dataloader worker (pid")),
)
#: The modules whose frames in a traceback mean that the error came out of data loading.
DATA_MODULES = ("torch.utils.data.", "torchdata.")


def failure_in_torch_terms(exception: BaseException) -> FailureClass | None:
    """The failure class torch tells ``exception`` is of, by its type, its message (allocators, anomaly
    mode, gloo, NCCL, a DataLoader worker's re-raise) or a data-loading frame it passed; ``None`` if none."""
    if isinstance(exception, torch.OutOfMemoryError):
        return FailureClass.OUT_OF_MEMORY
    if isinstance(exception, getattr(torch.distributed, "DistError", ())):
        return FailureClass.COMMUNICATION
    text = str(exception).lower()
    found = next((failure for failure, texts in FAILURE_TEXTS if any(t in text for t in texts)), None)
    trace = exception.__traceback__
    while found is None and trace is not None:
        if str(trace.tb_frame.f_globals.get("__name__", "")).startswith(DATA_MODULES):
            found = FailureClass.DATA
        trace = trace.tb_next
    return found
