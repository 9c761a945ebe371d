"""The writer and storage packages never import torch or lightning: the writer process starts fast and
small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning_resume

PACKAGE = Path(lightning_resume.__file__).parent
HEAVY = ("torch", "lightning", "lightning_fabric", "pytorch_lightning", "numpy")


def test_every_writer_and_storage_module_imports_without_torch_or_lightning() -> None:
    # The same stand-in package the writer's entry script uses, then every module of _writer and _storage.
    code = f"""
import pkgutil, sys, types, importlib
package = types.ModuleType("lightning_resume")
package.__path__ = [{str(PACKAGE)!r}]
sys.modules["lightning_resume"] = package
names = []
for sub in ("_writer", "_storage"):
    found = importlib.import_module("lightning_resume." + sub)
    names += [sub + "." + m.name for m in pkgutil.iter_modules(found.__path__) if m.name != "main"]
for name in names:
    importlib.import_module("lightning_resume." + name)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
print(len(names), heavy)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    count, heavy = out.split(" ", 1)
    # _writer: process; _storage: archive, atomic, background, catalog,
    # commit, direct_file, kinds, manifest, mirror, store
    assert int(count) >= 9, out
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
    assert any(part.endswith(b"_writer/main.py") for part in modules)
