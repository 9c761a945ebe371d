"""The checkpoint format, our streaming zip writer: what ``zipfile`` writes, ZIP64 where needed, read back
by torch."""

from __future__ import annotations

import io
import os
import struct
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

from lightning_resume._storage.archive import ArchiveWriter, fast_crc32, write_archive
from lightning_resume._storage.manifest import ChecksumWriter
from lightning_resume.io.routes import write_torch_archive

RECORDS = [
    ("data.pkl", b"\x80\x02pickle"),
    (".format_version", b"1"),
    ("data/0", os.urandom(100_000)),
    ("data/1", b""),
    ("data/\u00e9", os.urandom(777)),
]


def zipfile_archive(records: list[tuple[str, bytes]], alignment: int, identity: bytes) -> bytes:
    """The same archive written through ``zipfile`` (how the package wrote them before)."""
    raw = io.BytesIO()
    out = ChecksumWriter(raw)  # not seekable: zipfile streams, with data descriptors
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:  # type: ignore[arg-type]
        for name, data in [*records, ("version", b"3\n"), (".data/serialization_id", identity)]:
            info = zipfile.ZipInfo(f"archive/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            zip64 = len(data) * 1.05 > zipfile.ZIP64_LIMIT
            start = out.tell() + 30 + len(info.filename.encode()) + (20 if zip64 else 0) + 4
            pad = -start % alignment
            info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
            with zf.open(info, "w", force_zip64=zip64) as handle:
                handle.write(data)
    return raw.getvalue()


def ours(records: list[tuple[str, bytes]], alignment: int, identity: bytes) -> bytes:
    raw = io.BytesIO()
    writer = ArchiveWriter(ChecksumWriter(raw), alignment)
    for name, data in records:
        writer.add(name, data)
    writer.close(b"3\n", identity)
    return raw.getvalue()


def members(data: bytes) -> list[tuple[str, int, int, int, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.testzip() is None
        infos = archive.infolist()
        return [(i.filename, i.header_offset, i.CRC, i.file_size, archive.read(i)) for i in infos]


@pytest.mark.parametrize("alignment", [64, 4096])
def test_members_are_where_and_what_zipfile_writes(alignment: int) -> None:
    identity = b"1" * 40
    expected = members(zipfile_archive(RECORDS, alignment, identity))
    assert members(ours(RECORDS, alignment, identity)) == expected
    assert all(offset % alignment == 0 for offset in data_offsets(ours(RECORDS, alignment, identity)))


def data_offsets(data: bytes) -> list[int]:
    offsets = []
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            at = info.header_offset
            name_len, extra_len = struct.unpack("<HH", data[at + 26 : at + 30])
            offsets.append(at + 30 + name_len + extra_len)
    return offsets


def test_zip64_fields_where_sizes_and_offsets_need_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lowered limit puts every ZIP64 field (sizes, offsets, end record) in a small archive."""
    monkeypatch.setattr(ArchiveWriter, "zip64_limit", 1000)
    data = ours(RECORDS, 64, b"2" * 40)
    assert b"PK\006\006" in data and b"PK\006\007" in data  # ZIP64 end record and locator
    assert [m[4] for m in members(data)][: len(RECORDS)] == [d for _, d in RECORDS]
    state = {"w": torch.randn(300, 100), "b": torch.arange(5), "step": 3}
    path = tmp_path / "zip64.ckpt"
    with open(path, "wb") as raw:
        write_torch_archive(state, ChecksumWriter(raw))
    loaded = torch.load(path, weights_only=True)  # torch's own (miniz) reader
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])
    assert torch.equal(torch.load(path, weights_only=True, mmap=True)["w"], state["w"])


def test_write_archive_takes_records_in_order() -> None:
    raw = io.BytesIO()
    write_archive(ChecksumWriter(raw), RECORDS)
    names = [m[0] for m in members(raw.getvalue())]
    last = ["archive/version", "archive/.data/serialization_id"]
    assert names == [f"archive/{n}" for n, _ in RECORDS] + last


def test_the_fast_crc_is_isal_and_agrees_with_zlib() -> None:
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    assert fast_crc32() is isal_zlib.crc32
    data = os.urandom(1 << 20)
    assert fast_crc32()(data, 0) == zlib.crc32(data)
    assert fast_crc32()(data[1000:], fast_crc32()(data[:1000], 0)) == zlib.crc32(data)
