"""The tested range of Lightning and torch: what the installed versions are against it, and the warning
outside it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from conftest import tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import RequeueCheckpoint, RunDir
from lightning_resume._compat import versions
from lightning_resume.cli.doctor import version_checks
from lightning_resume.last_ckpt import requeue_checkpoint

pytestmark = pytest.mark.edge  # run again on the lowest Lightning and torch declared


def test_the_installed_lightning_and_torch_are_within_the_tested_range() -> None:
    assert versions.untested("lightning") is None
    assert versions.untested("torch") is None
    assert {f.check for f in version_checks() if f.level.value == "ok"} >= {"lightning", "torch"}


def test_the_lowest_declared_versions_are_the_lowest_tested() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    for distribution in ("lightning", "torch"):
        lowest = ".".join(versions.TESTED[distribution][0].split(".")[:2])
        assert f'"{distribution}>={lowest}"' in pyproject


def test_a_newer_lightning_than_tested_warns_once_and_doctor_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(versions.TESTED, "lightning", ("2.0.0", "2.0.1"))
    monkeypatch.setattr(requeue_checkpoint, "_WARNED", set())

    def fit(key: str) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = tiny_trainer(
                RunDir(root=tmp_path / "runs", key=key), RequeueCheckpoint(), tmp_path=tmp_path
            )
            trainer.fit(BoringModel())
        return [str(w.message) for w in caught if "newest tested" in str(w.message)]

    (first,) = fit("a")
    assert "newer than the newest tested, 2.0.1" in first and "lightning-resume doctor" in first
    assert fit("b") == []  # once per process
    (finding,) = [f for f in version_checks() if f.check == "lightning"]
    assert finding.level.value == "warn" and "newer than the newest tested" in finding.detail
