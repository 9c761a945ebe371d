"""No module outside ``lightning_resume._compat`` touches the internals of Lightning, torch, torchmetrics
or torchdata: every such touch is one named function there, pinned by a test of its own."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
from private_names import package_touches, private_overrides

import lightning_resume

pytestmark = pytest.mark.edge  # run again on the lowest Lightning and torch declared

PACKAGE = Path(lightning_resume.__file__).parent


def test_no_module_outside_compat_reads_or_writes_their_private_names() -> None:
    touches = package_touches(PACKAGE)
    assert not touches, "\n".join(map(str, touches))


def test_no_class_outside_compat_overrides_a_private_method_of_theirs() -> None:
    names = [m.name for m in pkgutil.walk_packages([str(PACKAGE)], "lightning_resume.")]
    modules = [n for n in names if "._compat" not in n and ".pytorch_lightning" not in n]
    found = [touch for name in modules for touch in private_overrides(name)]
    assert not found, "\n".join(map(str, found))


def test_the_check_finds_each_kind_of_touch(tmp_path: Path) -> None:
    source = tmp_path / "pkg" / "mod.py"
    source.parent.mkdir()
    (tmp_path / "pkg" / "_compat").mkdir()
    source.write_text(
        "import sys, warnings, torch\n"
        "from torch.utils.data._utils.worker import _generate_state\n"
        "from lightning.pytorch.loops.loop import _Loop\n"
        "def f(trainer, loader, strategy, metric):\n"
        "    trainer._checkpoint_connector\n"
        "    torch.serialization._save\n"
        "    getattr(loader, '_num_samples')\n"
        "    loader.__dict__['_get_iterator']\n"
        "    strategy.load_checkpoint = print\n"
        "    trainer.callbacks = []\n"
        "    warnings.filterwarnings('ignore', message='x')\n"
        "    sys._getframe(1)\n"
    )
    found = {t.what.split(" ")[0] for t in package_touches(tmp_path / "pkg")}
    assert len(package_touches(tmp_path / "pkg")) >= 10, package_touches(tmp_path / "pkg")
    assert {"imports", "private", "replaces", "a", "getattr(...,"} <= found
    importlib.invalidate_caches()
