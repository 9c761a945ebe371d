"""What happens when...: RequeueCheckpoint and last.ckpt.

Cases of the reliability catalogue (``tests/bad_inputs.py``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from _sharded import fit_directories
from _system import permission_prefix
from bad_inputs import (
    Case,
    case,
    cases_of,
    cli,
    first_run,
    needs_permissions,
    restart,
    run_case,
    script,
)
from conftest import run_job, same_weights, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import (
    CheckpointVerificationError,
    DurableCheckpointIO,
    RequeueCheckpoint,
    ResumeError,
    RunDir,
)
from lightning_resume._storage.catalog import candidates
from lightning_resume._storage.kinds import MANIFEST_NAME
from lightning_resume._storage.manifest import manifest_path
from lightning_resume.run_dir import layout, save_record


@case(
    "SIGKILL of trainer and writer while the first asynchronous save is in flight",
    "the restart starts the run over, in the same run dir, and ends exact",
)
def first_async_save_killed(tmp_path: Path) -> None:
    reference = run_job(tmp_path / "ref", tmp_path / "ref.pt", "--loader", "plain", "--durable")
    assert reference.returncode == 0, reference.output
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    # Saves every 2 steps: the kill at step 3 comes before the writer process has even started.
    first = run_job(root, out, "--loader", "plain", "--durable", "--kill-at", 3, SLURM_JOB_ID=7)
    assert first.returncode == -9, first.output
    (run_dir,) = layout.run_dirs(root)
    if layout.last_checkpoint(run_dir).exists():
        pytest.skip("the writer committed the first save before the kill; the fault did not happen")
    assert not save_record.read(run_dir).committed
    again = run_job(root, out, "--loader", "plain", "--durable", SLURM_JOB_ID=7, SLURM_RESTART_COUNT=1)
    assert again.returncode == 0, again.output
    assert again.run_dir == run_dir
    assert same_weights(out, tmp_path / "ref.pt")


@case(
    "`last.ckpt` lost after the run committed a checkpoint",
    "`ResumeError` on restart: restore `last.ckpt`, or use another key",
)
def lost_last_checkpoint(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path)
    layout.last_checkpoint(run_dir).unlink()
    with pytest.raises(ResumeError, match="does not exist although the run has saved checkpoints"):
        restart(tmp_path)


@case(
    "the run's `checkpoints/` folder lost (deleted, moved, a wrong `dirpath`) after it saved",
    "the restart resumes from a copy in a node's memory tier or on the mirror; with none, `ResumeError` "
    "naming the missing `last.ckpt` and the tiers searched, never a silent start over",
)
def lost_checkpoint_folder(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    run_dir = first_run(tmp_path, plugin=DurableCheckpointIO(asynchronous=False, mirror=str(mirror)))
    shutil.rmtree(layout.checkpoint_dir(run_dir))
    shutil.rmtree(mirror)  # the mirror lost too: no copy anywhere
    with pytest.raises(ResumeError) as lost:
        restart(tmp_path, plugin=DurableCheckpointIO(asynchronous=False, mirror=str(mirror)))
    message = str(lost.value)
    assert f"{str(layout.last_checkpoint(run_dir))!r} does not exist although the run has saved" in message
    assert "saves.json' says so), and no copy of it is in the mirror " in message
    assert not layout.last_checkpoint(run_dir).exists()


@case(
    "restart of a run stopped before its first save",
    "starts from the beginning in the same run dir",
)
def never_saved(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path)
    layout.last_checkpoint(run_dir).unlink()
    layout.saves_record(run_dir).unlink()  # as before the first save: nothing committed yet
    restart(tmp_path)
    assert torch.load(layout.last_checkpoint(run_dir), weights_only=True)["global_step"] == 4


@case(
    "torn `last.ckpt` with `DurableCheckpointIO`",
    "one warning; the newest committed checkpoint that verifies is loaded",
)
def torn_last_with_plugin(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    io = DurableCheckpointIO(asynchronous=False)
    io.save_checkpoint({"global_step": 1}, folder / "a.ckpt")
    io.save_checkpoint({"global_step": 2}, folder / "last.ckpt")
    with open(folder / "last.ckpt", "ab") as handle:
        handle.write(b"x")
    with pytest.warns(UserWarning, match="torn .* instead, the newest checkpoint that verifies"):
        assert io.load_checkpoint(folder / "last.ckpt")["global_step"] == 1


@case(
    "zero-byte or random `last.ckpt` without the plugin, on restart",
    "`ResumeError` saying the file is damaged and what to do (not torch's `EOFError`)",
)
def damaged_last_without_plugin(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path)
    for content in (b"", os.urandom(4096)):
        layout.last_checkpoint(run_dir).write_bytes(content)
        with pytest.raises(ResumeError, match=r"it is damaged .* no verified copy to fall back to"):
            restart(tmp_path)


@case(
    'a manifest with an out-of-range number (`"global_step": 1e999`)',
    "the checkpoint counts as unverifiable: a clear error on restart, `inspect` works",
)
def manifest_number_out_of_range(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))
    manifest = manifest_path(layout.last_checkpoint(run_dir))
    manifest.write_text(manifest.read_text().replace('"global_step": 2', '"global_step": 1e999'))
    for target in (tmp_path / "root", run_dir):
        code, _, err = cli("inspect", target, "--json")
        assert code == 0, err
    report = json.loads(cli("inspect", run_dir, "--json")[1])
    assert report["checkpoints"][0]["result"] == "unverifiable"
    with pytest.raises(CheckpointVerificationError, match="unverifiable"):
        restart(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))


@case(
    "an unreadable manifest (`{garbage`) next to `last.ckpt`",
    "`inspect` and the restart agree: not loaded; the error says to delete or restore the manifest",
)
def garbage_manifest(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))
    manifest_path(layout.last_checkpoint(run_dir)).write_text("{garbage")
    report = json.loads(cli("inspect", run_dir, "--json")[1])
    assert report["next_restart_loads"]["checkpoint"] is None
    with pytest.raises(CheckpointVerificationError, match="delete the manifest"):
        restart(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))


@case(
    "a manifest (file or directory) written by a newer `lightning_resume` (a higher `version`)",
    "the restart error and `inspect` name both versions and say to upgrade: the checkpoint is not damaged",
)
def manifest_from_a_newer_version(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))
    manifest = manifest_path(layout.last_checkpoint(run_dir))
    data = json.loads(manifest.read_text())
    data["version"], data["entries"][0]["versions"]["lightning_resume"] = 99, "9.9.9"
    manifest.write_text(json.dumps(data))
    why = json.loads(cli("inspect", run_dir, "--json")[1])["next_restart_loads"]["why"]
    assert "written by lightning-resume 9.9.9, newer than this lightning-resume" in why, why
    assert "upgrade lightning-resume" in why and "delete the manifest" not in why, why
    upgrade = (
        r"written by lightning-resume 9\.9\.9, newer than this lightning-resume .*Upgrade lightning-resume"
    )
    with pytest.raises(CheckpointVerificationError, match=upgrade):
        restart(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))
    # A sharded checkpoint: every directory written by the newer version.
    sharded, _, _ = fit_directories(tmp_path / "sharded", steps=2)
    for directory in candidates(layout.last_checkpoint(sharded.path)):
        data = json.loads((directory / MANIFEST_NAME).read_text())
        data["version"], data["versions"]["lightning_resume"] = 99, "9.9.9"
        (directory / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(CheckpointVerificationError, match=upgrade):
        fit_directories(tmp_path / "sharded", steps=4)


@case(
    "`last.ckpt` is a dangling symlink, or a directory with a manifest",
    "`inspect` reports it (`missing`, `not a file`), no traceback",
)
def odd_last_checkpoint(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))
    last = layout.last_checkpoint(run_dir)
    last.unlink()
    last.symlink_to(tmp_path / "nowhere.ckpt")
    for target in (tmp_path / "root", run_dir):
        code, _, err = cli("inspect", target)
        assert code == 0 and "Traceback" not in err, err
    assert json.loads(cli("inspect", run_dir, "--json")[1])["checkpoints"][0]["result"] == "missing"
    last.unlink()
    last.mkdir()
    for target in (tmp_path / "root", run_dir):
        code, _, err = cli("inspect", target)
        assert code == 0 and "Traceback" not in err, err
    assert json.loads(cli("inspect", run_dir, "--json")[1])["checkpoints"][0]["result"] == "not a file"


@case(
    "a checkpoint of another run passed on a restart",
    "`ResumeError`: two runs are never mixed",
)
def checkpoint_of_another_run(tmp_path: Path) -> None:
    other = first_run(tmp_path / "other", key="other")
    run_dir = first_run(tmp_path)
    shutil.copy(layout.last_checkpoint(other), layout.last_checkpoint(run_dir))
    with pytest.raises(ResumeError, match="Refusing to mix two runs"):
        restart(tmp_path)


@case(
    '`RequeueCheckpoint(every_n_train_steps="5" / 2.5 / True)`, `every_n_minutes="1"`',
    "`TypeError` naming the value",
)
def bad_intervals(tmp_path: Path) -> None:
    for value in ("5", 2.5, True):
        with pytest.raises(TypeError, match="every_n_train_steps must be a whole number"):
            RequeueCheckpoint(every_n_train_steps=value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="every_n_minutes must be a number"):
        RequeueCheckpoint(every_n_minutes="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="every_n_train_steps must be >= 1"):
        RequeueCheckpoint(every_n_train_steps=0)


@case(
    "read-only `checkpoints/` without the plugin",
    "`PermissionError` naming the directory (Lightning's writer hides it), `last.ckpt` intact",
)
@needs_permissions
def read_only_checkpoints(tmp_path: Path) -> None:
    result = script(
        tmp_path,
        f"""
        import os, stat
        import lightning.pytorch as pl
        from lightning.pytorch.demos.boring_classes import BoringModel
        from lightning_resume import RequeueCheckpoint, RunDir

        class ReadOnly(pl.Callback):
            # Runs before RequeueCheckpoint's save of step 2 (Lightning calls checkpoint callbacks last).
            def on_train_batch_end(self, trainer, *args):
                if trainer.global_step == 2:
                    os.chmod(run_dir.checkpoint_dir, 0o555)

        run_dir = RunDir(root={str(tmp_path / "root")!r})
        trainer = pl.Trainer(max_steps=6, limit_val_batches=0, logger=False, enable_progress_bar=False,
                             callbacks=[ReadOnly(), run_dir, RequeueCheckpoint(every_n_train_steps=1)],
                             default_root_dir={str(tmp_path)!r})
        try:
            trainer.fit(BoringModel())
        except OSError as e:
            print("ERROR", type(e).__name__, e)
        finally:
            os.chmod(run_dir.checkpoint_dir, 0o755)
        import torch
        print("STEP", torch.load(run_dir.checkpoint_dir / "last.ckpt", weights_only=True)["global_step"])
        """,
        *permission_prefix() or (),
    )
    assert "ERROR PermissionError" in result.stdout, result.stdout + result.stderr
    assert "make" in result.stdout and "writable" in result.stdout
    assert "STEP 1" in result.stdout


@case(
    "Ctrl-C (`KeyboardInterrupt`) before the first save",
    "the log says no checkpoint was saved yet (a restart starts over); it claims no save",
)
def interrupt_before_first_save(tmp_path: Path) -> None:
    class Interrupt(BoringModel):
        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            raise KeyboardInterrupt

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("lightning_resume").addHandler(handler)
    try:
        trainer = tiny_trainer(
            RunDir(root=tmp_path / "root"), RequeueCheckpoint(every_n_train_steps=5), tmp_path=tmp_path
        )
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            trainer.fit(Interrupt())
    finally:
        logging.getLogger("lightning_resume").removeHandler(handler)
    stopped = [r for r in records if r.startswith("fit stopped by")]
    assert stopped and "no checkpoint was saved yet" in stopped[0], records


@pytest.mark.parametrize("entry", cases_of(__name__), ids=lambda c: c.name)
def test_catalogue(entry: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_case(entry, tmp_path, request)
