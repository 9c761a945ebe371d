"""The restart rule and the fallback order: what the docs state, what ``inspect`` predicts and what
the callbacks and the plugin do are one rule, checked on the same run dirs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import DurableCheckpointIO, RequeueCheckpoint, ResumeError, RunDir
from lightning_resume._storage.catalog import FALLBACK_RULE
from lightning_resume.cli.inspect import describe_run
from lightning_resume.last_ckpt.restart import RULES, Restart, decide
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.binding import PROCESS

DOC = (Path(__file__).resolve().parent.parent / "docs" / "src" / "how_resume_works.md").read_text()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_docs_state_the_restart_rule_and_the_fallback_order_the_code_applies() -> None:
    page = _one_line(DOC)
    for rule in Restart:
        assert _one_line(rule.rule) in page, rule
    assert _one_line(FALLBACK_RULE) in page


def fit(tmp_path: Path, steps: int) -> RunDir:
    """Fit BoringModel under session key "rules" for ``steps`` steps, saving every step."""
    PROCESS.reset()  # a new process, as a restart would be
    run_dir = RunDir(root=tmp_path / "root", key="rules")
    trainer = tiny_trainer(
        run_dir, RequeueCheckpoint(every_n_train_steps=1), tmp_path=tmp_path, max_steps=steps, max_epochs=3
    )
    trainer.fit(BoringModel())
    return run_dir


@pytest.mark.parametrize("state", list(Restart))
def test_inspect_and_the_restart_follow_the_same_rule(tmp_path: Path, state: Restart) -> None:
    first = fit(tmp_path, 2)
    last, record = layout.last_checkpoint(first.path), layout.saves_record(first.path)
    if state is not Restart.RESUME:
        last.unlink()
    if state is Restart.START_OVER:
        record.unlink()
    assert decide(first.path) is state
    predicted = describe_run(first.path)["next_restart_loads"]
    if state is Restart.RESUME:
        assert predicted["checkpoint"] == layout.LAST_CKPT
        again = fit(tmp_path, 3)
        assert torch.load(layout.last_checkpoint(again.path), weights_only=True)["global_step"] == 3
    elif state is Restart.LOST:
        assert (predicted["checkpoint"], predicted["why"]) == (None, RULES[state])
        with pytest.raises(ResumeError, match="does not exist although the run has saved checkpoints"):
            fit(tmp_path, 3)
    else:
        assert (predicted["checkpoint"], predicted["why"]) == (None, RULES[state])
        again = fit(tmp_path, 3)
        assert again.path == first.path and layout.last_checkpoint(again.path).is_file()


def test_inspect_names_the_checkpoint_the_plugin_falls_back_to(tmp_path: Path) -> None:
    # The highest step is not the newest save: the fallback follows the save time, and so must inspect.
    run_dir = tmp_path / "run"
    folder = layout.checkpoint_dir(run_dir)
    io = DurableCheckpointIO(asynchronous=False)
    for name, step in (("epoch=1-step=100.ckpt", 100), ("epoch=0-step=50.ckpt", 50), ("last.ckpt", 70)):
        io.save_checkpoint({"global_step": step, "w": torch.full((4,), float(step))}, folder / name)
    with open(folder / "last.ckpt", "ab") as handle:
        handle.write(b"torn")
    predicted = describe_run(run_dir)["next_restart_loads"]["checkpoint"]
    with pytest.warns(UserWarning, match="falls? back|instead, the newest checkpoint that verifies"):
        loaded = io.load_checkpoint(folder / "last.ckpt")
    assert predicted == "epoch=0-step=50.ckpt"
    assert loaded["global_step"] == 50
