"""The snapshot step of an asynchronous save: every storage copied once into reusable shared memory, then
pickled by torch's serialiser against those copies into the records of its ``torch.save`` archive."""

from __future__ import annotations

import contextlib
import ctypes
import io
import itertools
import logging
import mmap
import os
import tempfile
import threading
import time
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch

from lightning_resume._compat.torch import record_torch_save
from lightning_resume._storage.archive import Data

log = logging.getLogger(__name__)

# A region of the shared buffer ("shm", offset, nbytes) or the record's bytes ("bytes", data).
Source = tuple[str, int, int] | tuple[str, bytes]
Region = tuple[int, int, int]  # (destination address, source address, bytes)
_PAGE = mmap.PAGESIZE
PIECE = 16 << 20  #: bytes per piece: the threads end together, and taking one costs nothing (~1 ms copy)
ALONE_BELOW = 32 << 20  #: less in all is copied by the caller alone: starting a thread costs more


def copy_regions(regions: Sequence[Region], threads: int, piece: int = PIECE) -> None:
    """Copy every ``(dst, src, nbytes)`` region with ``threads`` threads (the caller's included) taking
    pieces in turn (torch's ``copy_`` spins its OpenMP threads: 3x as long on 2 busy cores). If the caller's
    copy is interrupted (a signal handler's exception), the helpers stop and are joined first."""
    total = sum(nbytes for _, _, nbytes in regions)
    helpers = min(threads, -(-total // piece)) - 1 if total >= ALONE_BELOW else 0
    todo = (
        (dst + start, src + start, min(piece, nbytes - start))
        for dst, src, nbytes in regions
        for start in range(0, nbytes, piece)
    )
    lock = threading.Lock()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            with lock:
                region = next(todo, None)
            if region is None:
                return
            ctypes.memmove(*region)

    name = "lightning-resume-copy"
    started = [threading.Thread(target=work, name=name, daemon=True) for _ in range(helpers)]
    try:
        for thread in started:
            thread.start()
        work()
    finally:
        stop.set()
        for thread in started:
            if thread.ident is not None:
                thread.join()


@cache
def torch_archive_version() -> bytes:
    """The ``version`` record this torch writes in a ``torch.save`` archive."""
    buffer = io.BytesIO()
    torch.save({}, buffer)
    with zipfile.ZipFile(buffer) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/version"))
        return archive.read(name)


def record_data(data: Any) -> Data:
    """A record's content as bytes or a zero-copy view of a CPU storage."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray)):
        return data
    if isinstance(data, torch.UntypedStorage):
        return torch.empty(0, dtype=torch.uint8).set_(data).numpy().data
    raise TypeError(f"unexpected record of type {type(data).__name__}")


class HostBuffer:
    """Shared memory for the writer process, reused and only growing: a ``memfd``, freed when both exit."""

    def __init__(self) -> None:
        self.fd = -1
        self.size = 0
        self._map: mmap.mmap | None = None
        self._bytes: torch.Tensor | None = None
        self._pinned = False

    def ensure(self, nbytes: int) -> None:
        """Make the buffer at least ``nbytes`` long (page-rounded; it never shrinks)."""
        if nbytes <= self.size:
            return
        new_size = -(-max(nbytes, _PAGE) // _PAGE) * _PAGE
        if self.fd < 0:
            self.fd = _shared_fd()
        os.ftruncate(self.fd, new_size)
        self._unmap()
        self._map = mmap.mmap(self.fd, new_size)
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self.size = new_size

    @property
    def base(self) -> int:
        assert self._bytes is not None
        return self._bytes.data_ptr()

    def region(self, offset: int, nbytes: int) -> torch.UntypedStorage:
        assert self._map is not None
        return torch.frombuffer(self._map, dtype=torch.uint8, count=nbytes, offset=offset).untyped_storage()

    def pin(self) -> None:
        """Page-lock the buffer for fast, asynchronous device-to-host copies (best effort)."""
        if self._pinned or self._bytes is None or not torch.cuda.is_available():
            return
        with contextlib.suppress(Exception):
            # cudaHostRegisterPortable: pinned for every device's context, not only the current one's.
            error = torch.cuda.cudart().cudaHostRegister(self.base, self.size, 1)
            self._pinned = int(error) == 0
        if not self._pinned:
            log.debug("could not pin the checkpoint staging buffer; device copies will be synchronous")

    def _unmap(self) -> None:
        if self._pinned:
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(self.base)
            self._pinned = False
        self._bytes = None
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view still alive; it is freed with the view
                self._map.close()
            self._map = None

    def close(self) -> None:
        self._unmap()
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.size = -1, 0


def _shared_fd() -> int:
    if hasattr(os, "memfd_create"):
        return os.memfd_create("lightning-resume-checkpoint", os.MFD_CLOEXEC)
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, name = tempfile.mkstemp(prefix="lightning-resume-", dir=folder)
    os.unlink(name)
    return fd


@dataclass
class Staged:
    """A checkpoint snapshot: the archive records, pointing into the shared buffer where they can."""

    records: list[tuple[str, Source]] = field(default_factory=list)
    alignment: int = 64
    buffer_size: int = 0
    nbytes: int = 0


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    """Where ``t``'s storage lives; ``None``: the snapshot leaves ``t`` to torch's serialiser."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.is_quantized:
        return None
    if t.device.type == "meta" or t.is_conj() or t.is_neg() or t.untyped_storage().nbytes() == 0:
        return None
    return str(t.device), t.untyped_storage().data_ptr()


def _walk(obj: Any, on_tensor: Callable[[torch.Tensor], Any]) -> Any:
    """Rebuild plain containers (dict, OrderedDict, list, tuple) with ``on_tensor`` applied to tensors."""
    kind = type(obj)
    if isinstance(obj, torch.Tensor):
        return on_tensor(obj)
    if kind is dict:
        return {k: _walk(v, on_tensor) for k, v in obj.items()}
    if kind is OrderedDict:
        rebuilt: OrderedDict[Any, Any] = OrderedDict((k, _walk(v, on_tensor)) for k, v in obj.items())
        rebuilt.__dict__.update(vars(obj))  # a state_dict's `_metadata`
        return rebuilt
    if kind in (list, tuple):
        return kind(_walk(v, on_tensor) for v in obj)
    return obj


class _Phases:
    """Wall time, CPU time, minor faults and preemptions of each phase of a staging (at DEBUG only)."""

    def __init__(self) -> None:
        self.enabled = log.isEnabledFor(logging.DEBUG)
        self._marks = [("", self._now())] if self.enabled else []

    @staticmethod
    def _now() -> tuple[float, float, int, int]:
        import resource

        usage = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
        return time.perf_counter(), time.thread_time(), usage.ru_minflt, usage.ru_nivcsw

    def end(self, name: str) -> None:
        if self.enabled:
            self._marks.append((name, self._now()))

    def log(self, nbytes: int) -> None:
        """One DEBUG line; the wall time of each phase also goes in the record's ``phases``."""
        if not self.enabled:
            return
        parts, walls = [], {}
        for (_, before), (name, after) in itertools.pairwise(self._marks):
            wall, cpu, faults, csw = (a - b for a, b in zip(after, before, strict=True))
            walls[name] = wall
            parts.append(f"{name} {wall * 1e3:.1f} ms (cpu {cpu * 1e3:.1f}, {faults} faults, {csw} switches)")
        total = self._marks[-1][1][0] - self._marks[0][1][0]
        log.debug(
            "staged %d bytes in %.1f ms: %s", nbytes, total * 1e3, ", ".join(parts), extra={"phases": walls}
        )


def _copy(placed: list[tuple[torch.Tensor, int]], buffer: HostBuffer) -> None:
    """Copy each tensor's storage to its offset: device ones asynchronously while threads copy CPU ones."""
    streams = {}
    regions = []
    for t, offset in placed:
        storage = t.untyped_storage()
        if t.device.type == "cpu":
            regions.append((buffer.base + offset, storage.data_ptr(), storage.nbytes()))
            continue
        dst = torch.empty(0, dtype=torch.uint8).set_(buffer.region(offset, storage.nbytes()))
        src = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
        dst.copy_(src, non_blocking=t.is_cuda)
        if t.is_cuda:
            stream = torch.cuda.current_stream(t.device)
            streams[(stream.device, stream.cuda_stream)] = stream
    # torch's thread count is the CPU share the user gave this process; beyond 4, bandwidth is spent.
    copy_regions(regions, threads=min(torch.get_num_threads(), 4))
    for stream in streams.values():
        stream.synchronize()


def snapshot(checkpoint: Any, buffer: HostBuffer, alignment: int = 64) -> Staged:
    """The snapshot step: copy ``checkpoint`` into ``buffer``; return its ``torch.save`` records."""
    phases = _Phases()
    storages: dict[tuple[str, int], torch.Tensor] = {}  # by storage: the first tensor seen on it

    def plan(t: torch.Tensor) -> torch.Tensor:
        if (key := _storage_key(t)) is not None:
            storages.setdefault(key, t)
        return t

    _walk(checkpoint, plan)
    layout: dict[tuple[str, int], int] = {}
    offset = 0
    for key, t in storages.items():
        layout[key] = offset
        offset += -(-t.untyped_storage().nbytes() // alignment) * alignment
    buffer.ensure(offset)
    if any(t.is_cuda for t in storages.values()):
        buffer.pin()
    phases.end("plan")
    _copy([(t, layout[key]) for key, t in storages.items()], buffer)
    phases.end("copy")

    views: dict[int, torch.Tensor] = {}
    regions: dict[tuple[str, int], torch.UntypedStorage] = {}  # one storage object each: torch dedupes by it

    def swap(t: torch.Tensor) -> torch.Tensor:
        if id(t) in views:
            return views[id(t)]
        key = _storage_key(t)
        if key is None or key not in layout:
            return t
        if key not in regions:
            regions[key] = buffer.region(layout[key], t.untyped_storage().nbytes())
        with torch.no_grad():
            view = torch.empty(0, dtype=t.dtype).set_(regions[key], t.storage_offset(), t.size(), t.stride())
        if isinstance(t, torch.nn.Parameter):
            view = torch.nn.Parameter(view, requires_grad=t.requires_grad)
        elif t.requires_grad and t.is_leaf:
            view.requires_grad_(True)
        views[id(t)] = view
        return view

    snapshot = _walk(checkpoint, swap)
    phases.end("views")
    staged = Staged(alignment=alignment, buffer_size=buffer.size, nbytes=offset)
    base, end = buffer.base, buffer.base + buffer.size

    def write_record(name: str, data: Any, nbytes: int) -> None:
        storage = isinstance(data, torch.UntypedStorage)
        ptr = data.data_ptr() if storage else 0
        if storage and nbytes and base <= ptr and ptr + nbytes <= end:
            source: Source = ("shm", ptr - base, nbytes)
        else:  # bytes, or a tensor outside plain containers (torch handed us a CPU storage): copied now
            source = ("bytes", bytes(record_data(data)))
            staged.nbytes += nbytes if storage else 0
        if name == ".storage_alignment":
            staged.alignment = int(source[1])
        staged.records.append((name, source))

    record_torch_save(snapshot, write_record)
    phases.end("pickle")
    phases.log(staged.nbytes)
    return staged
