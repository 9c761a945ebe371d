"""Manifests, checksums and retention: pure logic, no Trainer."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import xxhash

from lightning_resume._storage.catalog import Status, verify
from lightning_resume._storage.commit import beyond_keep
from lightning_resume._storage.kinds import FILE
from lightning_resume._storage.manifest import (
    ChecksumWriter,
    Entry,
    check_metadata,
    checksum_file,
    decode,
    encode,
    manifest_path,
    next_entries,
    read_entries,
    sized,
)


def entry(checksum: str, size: int = 10, saved_at: float = 0.0, **kw: object) -> Entry:
    return Entry(size=size, checksum=checksum, saved_at=saved_at, **kw)  # type: ignore[arg-type]


def test_checksum_writer_checksums_exactly_the_bytes_written() -> None:
    raw = io.BytesIO()
    out = ChecksumWriter(raw)
    out.write(b"hello ")
    out.write(memoryview(b"world"))
    assert out.tell() == 11
    assert out.checksum.hexdigest() == xxhash.xxh3_64(b"hello world").hexdigest()
    assert not out.seekable()


def test_checksum_file_reads_in_chunks(tmp_path: Path) -> None:
    data = bytes(range(256)) * 1000
    (tmp_path / "f").write_bytes(data)
    assert checksum_file(tmp_path / "f", chunk=1000) == (len(data), xxhash.xxh3_64(data).hexdigest())
    (tmp_path / "empty").write_bytes(b"")
    assert checksum_file(tmp_path / "empty") == (0, xxhash.xxh3_64().hexdigest())


def test_manifest_round_trips_and_rejects_what_is_not_one(tmp_path: Path) -> None:
    entries = [entry("aa", global_step=3, epoch=1, metadata={"loss": 0.5}), entry("bb")]
    assert decode(encode(entries)) == entries
    for bad in ("{", "[]", '{"format": "other"}', '{"format": "lightning-resume/checkpoint-manifest"}'):
        with pytest.raises(ValueError):
            decode(bad)
    newer = encode(entries).replace('"version": 1', '"version": 99')
    with pytest.raises(ValueError, match="newer"):
        decode(newer)
    ckpt = tmp_path / "last.ckpt"
    assert read_entries(ckpt) is None
    manifest_path(ckpt).write_text("garbage")
    assert read_entries(ckpt) == []


def test_next_manifest_keeps_the_entry_of_the_file_it_replaces() -> None:
    old, new = entry("old"), entry("new")
    assert next_entries(new, [old]) == [new, old]
    assert next_entries(new, []) == [new]
    assert next_entries(new, [new]) == [new]
    many = [entry(str(i)) for i in range(5)]
    assert len(next_entries(new, many)) == 3


def test_a_file_verifies_only_against_an_entry_with_its_size_and_checksum(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"1234567")
    size, checksum = checksum_file(path)
    manifest_path(path).write_text(encode([entry(checksum, size=5), entry("bb", size=size)]))
    assert verify(path, FILE).status is Status.CORRUPT
    manifest_path(path).write_text(encode([entry(checksum, size=5), entry(checksum, size=size)]))
    assert verify(path, FILE).manifest == entry(checksum, size=size)
    a, b = entry("aa", size=5), entry("bb", size=7)
    assert sized([a, b], 5) == [a]


def test_metadata_must_be_json_and_is_copied() -> None:
    source = {"run": "a", "nested": {"x": [1, 2]}}
    copied = check_metadata(source)
    source["nested"]["x"].append(3)  # type: ignore[index]
    assert copied == {"run": "a", "nested": {"x": [1, 2]}}
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        check_metadata({"tensor": object()})
    with pytest.raises(TypeError, match="mapping"):
        check_metadata([1, 2])  # type: ignore[arg-type]


def test_name_patterns_ignore_digits() -> None:
    assert FILE.family("epoch=3-step=400.ckpt") == "epoch=#-step=#.ckpt"
    assert FILE.family("last.ckpt") == "last.ckpt"
    assert FILE.family("last-v1.ckpt") == "last-v#.ckpt"


def test_retention_keeps_the_newest_per_pattern() -> None:
    found = {
        "step=1.ckpt": entry("1", saved_at=1),
        "step=2.ckpt": entry("2", saved_at=2),
        "step=3.ckpt": entry("3", saved_at=3),
        "last.ckpt": entry("l", saved_at=0),
        "hpc_ckpt_1.ckpt": entry("h", saved_at=5),
    }
    assert beyond_keep(found, 2, FILE.family) == ["step=1.ckpt"]
    assert beyond_keep(found, 1, FILE.family) == ["step=1.ckpt", "step=2.ckpt"]
    with pytest.raises(ValueError):
        beyond_keep(found, 0, FILE.family)
