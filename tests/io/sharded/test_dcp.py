"""``without_torch_crc32``: DCP's files skip torch's CRC32 while we write them; the setting comes back."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch

from lightning_resume.io.sharded.dcp import without_torch_crc32

pytestmark = pytest.mark.skipif(
    not hasattr(torch.serialization, "set_crc32_options"), reason="torch before 2.6 has no CRC32 setting"
)


def crcs(tensor: torch.Tensor) -> list[int]:
    """The CRC32 fields of the records ``torch.save`` writes for ``tensor``."""
    out = io.BytesIO()
    torch.save(tensor, out)
    return [info.CRC for info in zipfile.ZipFile(out).infolist() if info.file_size]


def test_saves_inside_the_block_carry_no_crc32_and_load_the_same() -> None:
    tensor = torch.arange(1000, dtype=torch.float32)
    assert all(crcs(tensor))
    with without_torch_crc32():
        assert not any(crcs(tensor))
        out = io.BytesIO()
        torch.save(tensor, out)
    assert torch.equal(torch.load(io.BytesIO(out.getvalue()), weights_only=True), tensor)
    assert all(crcs(tensor))


def test_a_user_who_turned_crc32_off_keeps_it_off() -> None:
    torch.serialization.set_crc32_options(False)
    try:
        with without_torch_crc32(), without_torch_crc32():
            assert not torch.serialization.get_crc32_options()
        assert not torch.serialization.get_crc32_options()
    finally:
        torch.serialization.set_crc32_options(True)
