"""Write the records of a ``torch.save`` archive as a zip file, without importing torch.

``torch.load`` reads any zip archive with the layout ``torch.save`` produces: one top-level folder
holding ``data.pkl``, the ``data/<key>`` storages, ``version`` and a few small records. Each record
starts at a multiple of the storage alignment (``torch.load(mmap=True)`` relies on it); the padding
goes in an extra field of the local header, as torch's own writer does.
"""

from __future__ import annotations

import secrets
import struct
import zipfile
from collections.abc import Iterable
from typing import Protocol

Data = bytes | bytearray | memoryview


class Sink(Protocol):
    """Where the archive goes: a stream that can write and tell its position."""

    def write(self, data: bytes, /) -> int: ...

    def tell(self) -> int: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


_PADDING_FIELD = 0x4246  # "FB", the extra-field id torch's writer pads with
# Records are written in pieces small enough to stay in the CPU cache between the zip CRC, the
# manifest checksum and the copy to the file.
_CHUNK = 2 << 20
_DATE = (1980, 1, 1, 0, 0, 0)


def use_fast_crc32() -> bool:
    """Make ``zipfile`` compute CRC-32s with ISA-L (several times faster than zlib) when installed.

    Rebinds ``zipfile``'s module-level ``crc32`` for the whole process, so only the writer process
    (which is ours alone) calls it. Returns whether ISA-L is in use.
    """
    try:
        from isal import isal_zlib
    except ImportError:
        return False
    zipfile.crc32 = isal_zlib.crc32  # type: ignore[attr-defined]
    return True


def serialization_id() -> bytes:
    """A random 40-digit id, the form ``torch.save`` writes to ``.data/serialization_id``."""
    return f"{secrets.randbits(128):040d}".encode()


def write_archive(
    out: Sink,
    records: Iterable[tuple[str, Data]],
    alignment: int = 64,
    version: bytes = b"3\n",
    archive: str = "archive",
) -> None:
    """Write ``records`` (name, bytes) as ``torch.save``'s zip layout, then ``version`` and an id.

    Args:
        out: A writable stream with ``tell()``; if it cannot seek, entries use data descriptors.
        records: The records ``torch.serialization`` produced, in order, without the folder prefix.
        alignment: Byte alignment of every record's data.
        version: Content of the ``version`` record.
        archive: Name of the top-level folder.
    """
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, data in records:
            _add(zf, out, f"{archive}/{name}", data, alignment)
        _add(zf, out, f"{archive}/version", version, alignment)
        _add(zf, out, f"{archive}/.data/serialization_id", serialization_id(), alignment)


def _add(zf: zipfile.ZipFile, out: Sink, name: str, data: Data, alignment: int) -> None:
    view = memoryview(data).cast("B")
    info = zipfile.ZipInfo(name, date_time=_DATE)
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = view.nbytes
    zip64 = view.nbytes * 1.05 > zipfile.ZIP64_LIMIT  # zipfile's own rule, made explicit
    # Local header: 30 fixed bytes, the name, the zip64 field (20 bytes) if any, then our padding.
    start = out.tell() + 30 + len(name.encode("utf-8")) + (20 if zip64 else 0) + 4
    pad = -start % alignment
    info.extra = struct.pack("<HH", _PADDING_FIELD, pad) + b"Z" * pad
    with zf.open(info, "w", force_zip64=zip64) as handle:
        for offset in range(0, view.nbytes, _CHUNK):
            handle.write(view[offset : offset + _CHUNK])
