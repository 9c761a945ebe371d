"""DurableCheckpointIO with real Trainers: atomic, verified, asynchronous saves and fallbacks on load."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import job_env
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import CheckpointSettings, DurableCheckpointIO, RequeueCheckpoint, RunDir
from lightning_resume._storage.catalog import Status, check_file
from lightning_resume._storage.manifest import manifest_path, read_entries
from lightning_resume.io.settings import settings_of


def verifies(path: Path) -> bool:
    return check_file(path).status is Status.VERIFIED


class StartStep(pl.Callback):
    """Records the global step training (re)starts from."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step = trainer.global_step


def trainer(root: Path, io: Any, max_steps: int, *callbacks: pl.Callback, **kw: Any) -> pl.Trainer:
    return pl.Trainer(
        max_steps=max_steps,
        limit_val_batches=0,
        plugins=[io] if io is not None else None,
        callbacks=list(callbacks),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **kw,
    )


def every_step(root: Path, **kw: Any) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=root, filename="{step}", every_n_train_steps=1, save_last=True, **kw)


def test_trainer_takes_the_plugin_as_its_checkpoint_io(tmp_path: Path) -> None:
    io = DurableCheckpointIO()
    assert trainer(tmp_path, io, 1).strategy.checkpoint_io is io
    assert io.writes_atomically


def test_fit_saves_verified_checkpoints_with_manifests(tmp_path: Path) -> None:
    writer_maps: list[str] = []

    class PeekWriter(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            pid = trainer.strategy.checkpoint_io._writer_pid  # type: ignore[attr-defined]
            if pid is not None and not writer_maps:
                writer_maps.append(Path(f"/proc/{pid}/maps").read_text())

    io = DurableCheckpointIO(metadata={"experiment": "unit"})
    trainer(
        tmp_path, io, 6, every_step(tmp_path, save_top_k=2, monitor="step", mode="max"), PeekWriter()
    ).fit(BoringModel())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "last.ckpt",
        "last.ckpt.manifest.json",
        "step=5.ckpt",
        "step=5.ckpt.manifest.json",
        "step=6.ckpt",
        "step=6.ckpt.manifest.json",
    ]
    assert all(verifies(tmp_path / n) for n in names if n.endswith(".ckpt"))
    entry = read_entries(tmp_path / "last.ckpt")[0]  # type: ignore[index]
    assert (entry.global_step, entry.metadata) == (6, {"experiment": "unit"})
    assert set(entry.versions) == {"lightning_resume", "lightning", "torch", "python"}
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 6  # plain torch reads it
    assert writer_maps and "libtorch" not in writer_maps[0]  # the writer process never imports torch


@pytest.mark.parametrize("asynchronous", [True, False])
def test_resume_from_last(tmp_path: Path, asynchronous: bool) -> None:
    trainer(tmp_path, DurableCheckpointIO(asynchronous=asynchronous), 4, every_step(tmp_path)).fit(
        BoringModel()
    )
    start = StartStep()
    trainer(tmp_path, DurableCheckpointIO(asynchronous=asynchronous), 6, every_step(tmp_path), start).fit(
        BoringModel(), ckpt_path="last"
    )
    assert start.step == 4


def test_weights_changed_right_after_an_async_save_do_not_reach_the_file(tmp_path: Path) -> None:
    expected: dict[str, torch.Tensor] = {}

    class SaveThenScribble(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
            if trainer.global_step == 3:
                trainer.save_checkpoint(tmp_path / "snap.ckpt")
                expected.update({k: v.clone() for k, v in pl_module.state_dict().items()})
                with torch.no_grad():
                    for p in pl_module.parameters():
                        p.mul_(-1000.0)  # in place, while the writer is (likely) still writing

    trainer(tmp_path, DurableCheckpointIO(), 5, SaveThenScribble()).fit(BoringModel())
    saved = torch.load(tmp_path / "snap.ckpt", weights_only=True)["state_dict"]
    assert saved.keys() == expected.keys()
    assert all(torch.equal(saved[k], expected[k]) for k in saved)


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "torn":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    else:  # one flipped byte in the middle: same size, wrong checksum
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :])


@pytest.mark.parametrize("how", ["torn", "corrupt", "empty"])
def test_a_damaged_last_ckpt_falls_back_to_the_newest_verified_checkpoint(tmp_path: Path, how: str) -> None:
    trainer(
        tmp_path, DurableCheckpointIO(), 5, every_step(tmp_path, save_top_k=2, monitor="step", mode="max")
    ).fit(BoringModel())
    damage(tmp_path / "last.ckpt", how)
    (tmp_path / "step=5.ckpt").unlink()  # so the fallback is visibly older than last.ckpt
    start = StartStep()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, DurableCheckpointIO(), 7, every_step(tmp_path), start).fit(
            BoringModel(), ckpt_path="last"
        )
    ours = [str(w.message) for w in caught if "the newest checkpoint that verifies" in str(w.message)]
    assert len(ours) == 1, ours
    assert ("corrupt" if how == "corrupt" else "torn") in ours[0]
    assert "step=4.ckpt" in ours[0]
    assert start.step == 4


def test_nothing_verified_is_a_clear_error(tmp_path: Path) -> None:
    io = DurableCheckpointIO()
    trainer(tmp_path, io, 3, ModelCheckpoint(dirpath=tmp_path, save_top_k=0, save_last=True)).fit(
        BoringModel()
    )
    damage(tmp_path / "last.ckpt", "corrupt")
    with pytest.raises(RuntimeError, match=r"is corrupt .* and no other checkpoint in .* verifies"):
        io.load_checkpoint(tmp_path / "last.ckpt")
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "missing.ckpt")


def test_plain_lightning_checkpoints_still_load(tmp_path: Path) -> None:
    trainer(tmp_path, None, 3, every_step(tmp_path, save_top_k=-1)).fit(BoringModel())
    assert not manifest_path(tmp_path / "last.ckpt").exists()
    start = StartStep()
    trainer(tmp_path, DurableCheckpointIO(), 5, every_step(tmp_path), start).fit(
        BoringModel(), ckpt_path="last"
    )
    assert start.step == 3
    assert verifies(tmp_path / "last.ckpt")  # saved by the plugin now


def test_a_torn_plain_file_falls_back_to_a_verified_one(tmp_path: Path) -> None:
    io = DurableCheckpointIO(asynchronous=False)
    trainer(tmp_path, io, 2, every_step(tmp_path, save_top_k=-1)).fit(BoringModel())
    plain = tmp_path / "plain.ckpt"
    torch.save({"state_dict": {}}, plain)
    damage(plain, "torn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = io.load_checkpoint(plain)
    assert loaded["global_step"] == 2
    assert any("unreadable and has no manifest" in str(w.message) for w in caught)


def test_metadata_per_plugin_per_save_and_afterwards(tmp_path: Path) -> None:
    io = DurableCheckpointIO(metadata={"run": "a"})
    checkpoint = {"state_dict": {"w": torch.ones(2)}, "global_step": 7, "epoch": 1}
    path = tmp_path / "m.ckpt"
    io.save_checkpoint(checkpoint, path, storage_options={"metadata": {"val_loss": 0.25}})
    assert io.get_metadata(path) == {"run": "a", "val_loss": 0.25}
    io.update_metadata(path, {"tag": "best"})
    assert io.get_metadata(path) == {"run": "a", "val_loss": 0.25, "tag": "best"}
    io.set_metadata(path, {"only": True})
    assert io.get_metadata(path) == {"only": True}
    assert verifies(path) and read_entries(path)[0].global_step == 7  # type: ignore[index]
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint(checkpoint, path, storage_options={"compress": True})
    with pytest.raises(TypeError, match="JSON"):
        io.update_metadata(path, {"bad": object()})
    plain = tmp_path / "plain.ckpt"
    torch.save(checkpoint, plain)
    with pytest.raises(ValueError, match="no readable manifest"):
        io.get_metadata(plain)
    io.teardown()


def test_a_writer_error_is_raised_at_the_next_save_and_at_teardown(tmp_path: Path) -> None:
    io = DurableCheckpointIO()
    good, bad = tmp_path / "good.ckpt", tmp_path / "dir.ckpt"
    bad.mkdir()
    (bad / "occupied").write_text("a directory cannot be replaced by a file")
    io.save_checkpoint({"x": torch.ones(3)}, good)
    io.save_checkpoint({"x": torch.ones(3)}, bad)  # returns: the writer fails in the background
    with pytest.raises(
        OSError, match=r"Could not save checkpoint .*dir\.ckpt.*The previous checkpoint is intact"
    ):
        io.save_checkpoint({"x": torch.zeros(3)}, good)
    io.wait_until_durable()  # the error was reported once; the save that raised it did not happen
    assert torch.equal(torch.load(good)["x"], torch.ones(3)) and verifies(good)
    io.save_checkpoint({"x": torch.ones(3)}, bad)
    with pytest.raises(OSError, match=r"dir\.ckpt"):
        io.teardown()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".lr-tmp-")]


def test_a_failed_async_save_fails_fit(tmp_path: Path) -> None:
    bad = tmp_path / "dir.ckpt"
    bad.mkdir()
    (bad / "x").write_text("x")

    class SaveThere(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 2:
                trainer.save_checkpoint(bad)

    with pytest.raises(OSError, match="Could not save checkpoint"):
        trainer(tmp_path, DurableCheckpointIO(), 3, SaveThere()).fit(BoringModel())


def test_a_dead_writer_is_restarted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    io = DurableCheckpointIO()
    big = {"w": torch.randn(8, 1024, 1024)}  # 32 MB: the kill below lands while it is written
    path = tmp_path / "big.ckpt"
    io.save_checkpoint(big, path)
    io.wait_until_durable()
    first = io._writer_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)  # idle writer: found dead at the next save
    io.save_checkpoint(big, path)
    io.wait_until_durable()
    second = io._writer_pid
    assert second not in (None, first)
    with caplog.at_level(logging.WARNING, logger="lightning_resume"):
        big["w"].add_(1)
        os.kill(second, signal.SIGSTOP)  # it gets the request but cannot finish it
        io.save_checkpoint(big, path)
        time.sleep(0.2)
        os.kill(second, signal.SIGKILL)  # busy writer: the save is retried from the same snapshot
        io.wait_until_durable()
    assert verifies(path)
    assert torch.equal(torch.load(path)["w"], big["w"])
    assert any(f"process {second} exited" in r.message and "writing" in r.message for r in caplog.records)
    io.teardown()


@pytest.mark.parametrize("asynchronous", [True, False])
def test_each_version_s_manifest_lists_the_version_it_replaces(tmp_path: Path, asynchronous: bool) -> None:
    """A save of a file whose previous save is still being written lists that one as its fallback, not
    the one before: a kill inside the new save's rename leaves the previous version, which must verify."""
    io = DurableCheckpointIO(asynchronous=asynchronous)
    path = tmp_path / "last.ckpt"
    for step in range(4):  # 32 MiB each: the writer is still busy with one when the next is asked for
        io.save_checkpoint({"w": torch.full((8 << 20,), float(step)), "global_step": step}, path)
    io.wait_until_durable()
    assert [e.global_step for e in read_entries(path) or []] == [3, 2]
    io.teardown()


def test_a_save_from_inside_a_save_is_written_synchronously(tmp_path: Path) -> None:
    """Lightning's SLURM handler saves from a signal handler, which may interrupt a save being staged."""
    io = DurableCheckpointIO()
    inner = tmp_path / "inner.ckpt"

    class Interrupts:
        def __reduce__(self) -> tuple[Any, ...]:  # runs while the outer save is being staged
            io.save_checkpoint({"w": torch.full((1000,), 2.0)}, inner)
            return (dict, ())

    io.save_checkpoint({"w": torch.ones(1000), "interrupt": Interrupts()}, tmp_path / "outer.ckpt")
    assert verifies(inner) and torch.equal(torch.load(inner)["w"], torch.full((1000,), 2.0))
    io.wait_until_durable()
    assert torch.equal(torch.load(tmp_path / "outer.ckpt", weights_only=False)["w"], torch.ones(1000))
    io.teardown()


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_save_interrupted_by_a_save_of_the_same_file_lists_that_one_as_its_fallback(
    tmp_path: Path, asynchronous: bool
) -> None:
    io = DurableCheckpointIO(asynchronous=asynchronous)
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"w": torch.zeros(10), "global_step": 1}, path)

    class Interrupts:
        def __reduce__(self) -> tuple[Any, ...]:  # a signal handler's save, while the outer one snapshots
            io.save_checkpoint({"w": torch.ones(10), "global_step": 2}, path)
            return (dict, ())

    io.save_checkpoint({"w": torch.full((10,), 3.0), "global_step": 3, "interrupt": Interrupts()}, path)
    io.wait_until_durable()
    assert [e.global_step for e in read_entries(path) or []] == [3, 2]
    io.teardown()


def test_remove_waits_for_the_save_in_flight_and_keeps_the_only_verified_one(tmp_path: Path) -> None:
    io = DurableCheckpointIO()
    old, new = tmp_path / "old.ckpt", tmp_path / "new.ckpt"
    io.save_checkpoint({"w": torch.zeros(4)}, old)
    io.save_checkpoint({"w": torch.randn(1024, 1024)}, new)
    io.remove_checkpoint(old)  # must not delete before `new` is committed
    assert not old.exists() and verifies(new)
    with pytest.warns(UserWarning, match="only verified checkpoint"):
        io.remove_checkpoint(new)
    assert verifies(new)
    io.teardown()


def test_retention_keeps_the_newest_per_name_pattern(tmp_path: Path) -> None:
    io = DurableCheckpointIO(keep=2)
    trainer(tmp_path, io, 5, every_step(tmp_path, save_top_k=-1)).fit(BoringModel())
    ckpts = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert ckpts == ["last.ckpt", "step=4.ckpt", "step=5.ckpt"]
    assert not [p for p in tmp_path.glob("step=[123].ckpt*")]


def test_leftovers_of_a_killed_process_are_removed_on_start(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    litter = tmp_path / f".lr-tmp-{int(dead.stdout)}-x-last.ckpt"
    litter.write_bytes(b"half a checkpoint")
    trainer(tmp_path, DurableCheckpointIO(), 1, every_step(tmp_path)).fit(BoringModel())
    assert not litter.exists()


def test_requeue_checkpoint_writes_last_ckpt_through_the_plugin(tmp_path: Path) -> None:
    run_dir = RunDir(root=tmp_path / "runs")
    io = DurableCheckpointIO()
    trainer(tmp_path, io, 4, run_dir, RequeueCheckpoint(every_n_train_steps=2)).fit(BoringModel())
    last = run_dir.checkpoint_dir / "last.ckpt"
    assert verifies(last)
    assert not (run_dir.checkpoint_dir / ".last.ckpt.partial").exists()


def test_remote_paths_are_refused_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mirror="):
        DurableCheckpointIO().save_checkpoint({}, "s3://bucket/x.ckpt")
    with pytest.raises(ValueError, match="keep"):
        DurableCheckpointIO(keep=0)


CLI_SCRIPT = """
import os
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel, BoringDataModule
cli = LightningCLI(BoringModel, BoringDataModule, run=False, save_config_callback=None)
io = cli.trainer.strategy.checkpoint_io
print("PLUGIN", type(io).__name__, io.settings.keep, io.settings.metadata, io.settings.mirror.timeout)
cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=os.environ.get("CKPT"))
"""

CLI_CONFIG = """
trainer:
  max_steps: {steps}
  limit_val_batches: 0
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {root}
  plugins:
    - class_path: lightning_resume.DurableCheckpointIO
      init_args:
        keep: 2
        metadata: {{config: yaml}}
        mirror:
          class_path: lightning_resume.Mirror
          init_args: {{url: "file://{root}-mirror", wait: false, timeout: 60}}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        {{dirpath: {root}, filename: "{{step}}", every_n_train_steps: 1, save_top_k: -1, save_last: true}}
"""


@pytest.mark.long
def test_the_plugin_from_lightning_cli_yaml(tmp_path: Path) -> None:
    script = tmp_path / "cli.py"
    script.write_text(CLI_SCRIPT)
    for steps, ckpt in ((3, None), (5, "last")):
        config = tmp_path / f"config{steps}.yaml"
        config.write_text(CLI_CONFIG.format(root=tmp_path / "ckpt", steps=steps))
        cmd = [sys.executable, str(script), "--config", str(config)]
        proc = subprocess.run(cmd, env=job_env(CKPT=ckpt), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "PLUGIN DurableCheckpointIO 2 {'config': 'yaml'} 60.0" in proc.stdout
    assert "Restored all states" in proc.stderr + proc.stdout
    folder = tmp_path / "ckpt"
    assert sorted(p.name for p in folder.glob("*.ckpt")) == ["last.ckpt", "step=4.ckpt", "step=5.ckpt"]
    assert read_entries(folder / "last.ckpt")[0].metadata == {"config": "yaml"}  # type: ignore[index]
    assert all(verifies(p) for p in folder.glob("*.ckpt"))


def test_the_settings_are_one_frozen_object_any_plugin_has() -> None:
    io = DurableCheckpointIO(asynchronous=False, keep=3, metadata={"run": "a"})
    assert (io.settings.keep, dict(io.settings.metadata), io.settings.asynchronous) == (
        3,
        {"run": "a"},
        False,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        io.settings.keep = 4  # type: ignore[misc]
    assert settings_of(io).directories_kept == 3
    # A plugin that is not ours: the defaults (synchronous sharded saves, two directories kept).
    assert settings_of(TorchCheckpointIO()) == CheckpointSettings()
    assert settings_of(TorchCheckpointIO()).directories_kept == 2
