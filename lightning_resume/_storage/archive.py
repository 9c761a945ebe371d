"""The checkpoint format: a ``torch.save`` archive's records written as its zip file without torch, aligned
for ``torch.load(mmap=True)``; ours for ISA-L's CRC-32 and streaming (``benchmarks/checkpoint_io.py``)."""

from __future__ import annotations

import secrets
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol

Data = bytes | bytearray | memoryview


class Sink(Protocol):
    """Where the archive goes: a stream that can write and tell its position."""

    def write(self, data: Data, /) -> int: ...
    def tell(self) -> int: ...


_PADDING_FIELD = 0x4246  # "FB", the extra-field id torch's writer pads with
_ZIP64_FIELD = 0x0001
_CHUNK = 2 << 20  # stays in the CPU cache between the zip CRC, the manifest checksum and the copy
_DOS_DATE = (1980 - 1980) << 9 | 1 << 5 | 1  # 1980-01-01, 00:00:00: archives do not depend on the clock
_DOS_TIME = 0
_VERSION, _VERSION_ZIP64 = 20, 45
_DATA_DESCRIPTOR, _UTF8_NAME = 0x08, 0x800
_UNIX, _MODE = 3, 0o600 << 16
_LIMIT = zipfile.ZIP64_LIMIT  # zipfile's limits (signed 32 and 16 bits), for the readers it fits
_COUNT_LIMIT = zipfile.ZIP_FILECOUNT_LIMIT


@cache
def fast_crc32() -> Callable[[Data, int], int]:
    """ISA-L's CRC-32 (several times faster than zlib's) when installed, else zlib's."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.crc32
    return isal_zlib.crc32


@dataclass
class _Member:
    name: bytes
    flags: int
    offset: int
    size: int
    crc: int


class ArchiveWriter:
    """Writes ``torch.save``'s zip layout record by record to ``out``, each record's data aligned."""

    zip64_limit = _LIMIT  #: records this large (and offsets past it) get ZIP64 fields; tests lower it

    def __init__(self, out: Sink, alignment: int = 64) -> None:
        self.out = out
        self.alignment = alignment
        self._crc32 = fast_crc32()
        self._members: list[_Member] = []

    def add(self, name: str, data: Data) -> None:
        """Write the record ``name`` (without the folder prefix) with content ``data``."""
        view = memoryview(data).cast("B")
        full = f"archive/{name}"
        encoded, flags = full.encode(), _DATA_DESCRIPTOR | (0 if full.isascii() else _UTF8_NAME)
        zip64 = view.nbytes * 1.05 > self.zip64_limit  # zipfile's rule for a size known in advance
        offset = self.out.tell()
        # Local header: 30 fixed bytes, the name, our padding field, then the ZIP64 field if any.
        start = offset + 30 + len(encoded) + 4 + (20 if zip64 else 0)
        pad = -start % self.alignment
        extra = struct.pack("<HH", _PADDING_FIELD, pad) + b"Z" * pad
        if zip64:
            extra += struct.pack("<HHQQ", _ZIP64_FIELD, 16, 0, 0)
        version = _VERSION_ZIP64 if zip64 else _VERSION
        # CRC and sizes (0, 0, 0) follow the data, in the data descriptor.
        fixed = (version, 0, flags, 0, _DOS_TIME, _DOS_DATE, 0, 0, 0, len(encoded), len(extra))
        self.out.write(struct.pack("<4s2B4HL2L2H", b"PK\003\004", *fixed) + encoded + extra)
        crc = 0
        for start in range(0, view.nbytes, _CHUNK):
            piece = view[start : start + _CHUNK]
            crc = self._crc32(piece, crc)
            self.out.write(piece)
        crc &= 0xFFFFFFFF
        self.out.write(struct.pack("<LLQQ" if zip64 else "<LLLL", 0x08074B50, crc, view.nbytes, view.nbytes))
        self._members.append(_Member(encoded, flags, offset, view.nbytes, crc))

    def close(self, version: bytes = b"3\n", identity: bytes | None = None) -> None:
        """Write the ``version`` and serialization id (``identity``) records, then the central directory."""
        self.add("version", version)
        if identity is None:  # a random 40-digit id, as ``torch.save`` writes
            identity = f"{secrets.randbits(128):040d}".encode()
        self.add(".data/serialization_id", identity)
        start = self.out.tell()
        for member in self._members:
            self._central_entry(member)
        size = self.out.tell() - start
        count = len(self._members)
        if count > _COUNT_LIMIT or start > self.zip64_limit or size > self.zip64_limit:
            end64 = self.out.tell()
            fields = (44, _VERSION_ZIP64, _VERSION_ZIP64, 0, 0, count, count, size, start)
            self.out.write(struct.pack("<4sQ2H2L4Q", b"PK\006\006", *fields))
            self.out.write(struct.pack("<4sLQL", b"PK\006\007", 0, end64, 1))
            count, size, start = min(count, 0xFFFF), min(size, 0xFFFFFFFF), min(start, 0xFFFFFFFF)
        self.out.write(struct.pack("<4s4H2LH", b"PK\005\006", 0, 0, count, count, size, start, 0))

    def _central_entry(self, member: _Member) -> None:
        big_size, big_offset = member.size > self.zip64_limit, member.offset > self.zip64_limit
        fields = ([member.size, member.size] if big_size else []) + ([member.offset] if big_offset else [])
        extra = struct.pack(f"<HH{len(fields)}Q", _ZIP64_FIELD, 8 * len(fields), *fields) if fields else b""
        version = _VERSION_ZIP64 if fields else _VERSION
        size = 0xFFFFFFFF if big_size else member.size
        # After the flags: method 0 (stored); after the lengths: no comment, disk 0, no internal attributes.
        fixed = (version, _UNIX, version, 0, member.flags, 0, _DOS_TIME, _DOS_DATE, member.crc, size, size)
        tail = (len(member.name), len(extra), 0, 0, 0, _MODE, 0xFFFFFFFF if big_offset else member.offset)
        self.out.write(struct.pack("<4s4B4HL2L5H2L", b"PK\001\002", *fixed, *tail) + member.name + extra)


def write_archive(
    out: Sink, records: Iterable[tuple[str, Data]], alignment: int = 64, version: bytes = b"3\n"
) -> None:
    """Write ``records`` (names without the folder prefix, in torch's order), then ``version`` and an id."""
    writer = ArchiveWriter(out, alignment)
    for name, data in records:
        writer.add(name, data)
    writer.close(version)


def intact_zip(path: Path) -> bool:
    """Whether ``path`` is a complete zip archive whose records all pass their CRC check."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return False
