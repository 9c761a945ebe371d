"""Write the records of a ``torch.save`` archive as a zip file, without importing torch.

The layout ``torch.save`` produces (one top-level folder: ``data.pkl``, the ``data/<key>`` storages,
``version``...), each record aligned (``torch.load(mmap=True)`` relies on it; padding in a local-header
extra field, as torch pads), streamed as ``zipfile`` writes to a non-seekable stream (data descriptors,
ZIP64 where needed). Ours rather than ``zipfile``'s so that the CRC-32 can be ISA-L's (several times
faster than zlib's) without patching ``zipfile``, and records are added as torch hands them over.
"""

from __future__ import annotations

import secrets
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Protocol

Data = bytes | bytearray | memoryview


class Sink(Protocol):
    """Where the archive goes: a stream that can write and tell its position."""

    def write(self, data: Data, /) -> int: ...

    def tell(self) -> int: ...


_PADDING_FIELD = 0x4246  # "FB", the extra-field id torch's writer pads with
_ZIP64_FIELD = 0x0001
# Records are written in pieces small enough to stay in the CPU cache between the zip CRC, the
# manifest checksum and the copy to the file.
_CHUNK = 2 << 20
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


def serialization_id() -> bytes:
    """A random 40-digit id, the form ``torch.save`` writes to ``.data/serialization_id``."""
    return f"{secrets.randbits(128):040d}".encode()


@dataclass
class _Member:
    name: bytes
    flags: int
    offset: int
    size: int
    crc: int


class ArchiveWriter:
    """Writes ``torch.save``'s zip layout record by record to ``out`` (never asked to seek), each
    record's data aligned to ``alignment`` bytes, under the top-level folder ``archive``."""

    #: Records at least this large (and offsets past it) get ZIP64 fields; tests lower it.
    zip64_limit = _LIMIT

    def __init__(
        self,
        out: Sink,
        alignment: int = 64,
        archive: str = "archive",
        crc32: Callable[[Data, int], int] | None = None,
    ) -> None:
        self.out = out
        self.alignment = alignment
        self.archive = archive
        self._crc32 = crc32 or fast_crc32()
        self._members: list[_Member] = []

    def add(self, name: str, data: Data) -> None:
        """Write the record ``name`` (without the folder prefix) with content ``data``."""
        view = memoryview(data).cast("B")
        full = f"{self.archive}/{name}"
        try:
            encoded, flags = full.encode("ascii"), _DATA_DESCRIPTOR
        except UnicodeEncodeError:
            encoded, flags = full.encode("utf-8"), _DATA_DESCRIPTOR | _UTF8_NAME
        zip64 = view.nbytes * 1.05 > self.zip64_limit  # zipfile's rule for a size known in advance
        offset = self.out.tell()
        # Local header: 30 fixed bytes, the name, our padding field, then the ZIP64 field if any.
        start = offset + 30 + len(encoded) + 4 + (20 if zip64 else 0)
        pad = -start % self.alignment
        extra = struct.pack("<HH", _PADDING_FIELD, pad) + b"Z" * pad
        if zip64:
            extra += struct.pack("<HHQQ", _ZIP64_FIELD, 16, 0, 0)
        version = _VERSION_ZIP64 if zip64 else _VERSION
        sizes = (0, 0, 0)  # CRC and sizes follow the data, in the data descriptor
        fixed = (version, 0, flags, 0, _DOS_TIME, _DOS_DATE, *sizes, len(encoded), len(extra))
        header = struct.pack("<4s2B4HL2L2H", b"PK\003\004", *fixed)
        self.out.write(header + encoded + extra)
        crc = 0
        for start in range(0, view.nbytes, _CHUNK):
            piece = view[start : start + _CHUNK]
            crc = self._crc32(piece, crc)
            self.out.write(piece)
        crc &= 0xFFFFFFFF
        fmt = "<LLQQ" if zip64 else "<LLLL"
        self.out.write(struct.pack(fmt, 0x08074B50, crc, view.nbytes, view.nbytes))
        self._members.append(_Member(encoded, flags, offset, view.nbytes, crc))

    def close(self, version: bytes = b"3\n", identity: bytes | None = None) -> None:
        """Write the ``version`` and ``.data/serialization_id`` (``identity``, default: a random id)
        records, then the central directory."""
        self.add("version", version)
        self.add(".data/serialization_id", identity if identity is not None else serialization_id())
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
        fields = []
        size = offset = None
        if member.size > self.zip64_limit:
            fields += [member.size, member.size]
            size = 0xFFFFFFFF
        if member.offset > self.zip64_limit:
            fields.append(member.offset)
            offset = 0xFFFFFFFF
        extra = struct.pack(f"<HH{len(fields)}Q", _ZIP64_FIELD, 8 * len(fields), *fields) if fields else b""
        version = _VERSION_ZIP64 if fields else _VERSION
        stored = member.size if size is None else size
        fixed = (
            version,
            _UNIX,
            version,
            0,
            member.flags,
            0,
            _DOS_TIME,
            _DOS_DATE,
            member.crc,
            stored,
            stored,
        )
        # After the flags: method 0 (stored); after the lengths: no comment, disk 0, no internal attributes.
        tail = (len(member.name), len(extra), 0, 0, 0, _MODE, member.offset if offset is None else offset)
        entry = struct.pack("<4s4B4HL2L5H2L", b"PK\001\002", *fixed, *tail)
        self.out.write(entry + member.name + extra)


def write_archive(
    out: Sink,
    records: Iterable[tuple[str, Data]],
    alignment: int = 64,
    version: bytes = b"3\n",
    archive: str = "archive",
) -> None:
    """Write ``records`` (name without the folder prefix, bytes; in torch's order) as ``torch.save``'s
    zip layout (see :class:`ArchiveWriter`), then ``version`` and an id."""
    writer = ArchiveWriter(out, alignment, archive)
    for name, data in records:
        writer.add(name, data)
    writer.close(version)
