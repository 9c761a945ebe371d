"""The storage package (the writer process's code) never imports torch or lightning: the writer process
starts fast and small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning_resume

PACKAGE = Path(lightning_resume.__file__).parent
HEAVY = ("torch", "lightning", "lightning_fabric", "pytorch_lightning", "numpy")


def test_every_writer_and_storage_module_imports_without_torch_or_lightning() -> None:
    # The same stand-in package the writer process starts with, then every module of _storage.
    code = f"""
import pkgutil, sys, types, importlib
package = types.ModuleType("lightning_resume")
package.__path__ = [{str(PACKAGE)!r}]
sys.modules["lightning_resume"] = package
names = []
found = importlib.import_module("lightning_resume._storage")
names += ["_storage." + m.name for m in pkgutil.iter_modules(found.__path__)]
for name in names:
    importlib.import_module("lightning_resume." + name)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
print(len(names), heavy)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    count, heavy = out.split(" ", 1)
    # archive, atomic, background, catalog, commit, kinds, manifest, mirror, store, writer
    assert int(count) >= 10, out
    assert heavy.strip() == "[]", out


def test_the_running_writer_process_has_no_torch_loaded(tmp_path: Path) -> None:
    import torch

    from lightning_resume import DurableCheckpointIO

    io = DurableCheckpointIO()
    try:
        io.save_checkpoint({"w": torch.ones(4)}, tmp_path / "a.ckpt")
        io.wait_until_durable()
        pid = io._writer_pid
        assert pid is not None
        maps = Path(f"/proc/{pid}/maps").read_text()
        modules = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    finally:
        io.teardown()
    assert "libtorch" not in maps and "torch/lib" not in maps
    assert any(b"from lightning_resume._storage.writer import serve" in part for part in modules)
