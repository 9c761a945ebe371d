"""What happens when...: DurableCheckpointIO and sharded checkpoint directories.

Cases of the reliability catalogue (``tests/bad_inputs.py``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from _sharded import SHARD, DirectoryStrategy, fit_directories
from bad_inputs import (
    Case,
    case,
    cases_of,
    cli,
    run_case,
    script,
)

from lightning_resume import (
    CheckpointVerificationError,
    DurableCheckpointIO,
    MemoryTier,
    Mirror,
    ResumeError,
)
from lightning_resume._storage.catalog import candidates, verify
from lightning_resume._storage.kinds import DIRECTORY
from lightning_resume.io.sharded.parts import read_manifest
from lightning_resume.run_dir import layout


@case(
    '`DurableCheckpointIO(keep=1.5)`, `keep=0`, `Mirror(url, timeout=0)`, `mirror=""`, `mirror=3`',
    "`TypeError` / `ValueError` naming the value",
)
def bad_plugin_options(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="keep must be a whole number"):
        DurableCheckpointIO(keep=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        DurableCheckpointIO(keep=0)
    with pytest.raises(ValueError, match="Mirror timeout must be > 0"):
        DurableCheckpointIO(mirror=Mirror("s3://bucket/run", timeout=0))
    with pytest.raises(ValueError, match="Mirror url must be an fsspec URL"):
        DurableCheckpointIO(mirror="")
    with pytest.raises(TypeError, match="mirror must be a Mirror, an fsspec URL or None, got 3"):
        DurableCheckpointIO(mirror=3)  # type: ignore[arg-type]


@case(
    '`MemoryTier(replicas=-1)`, `durable_every=0`, `port=70000`, `path="$UNSET/x"`, `memory="/dev/shm"`',
    "`TypeError` / `ValueError` naming the value",
)
def bad_memory_tier_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="MemoryTier replicas must be >= 0"):
        MemoryTier(replicas=-1)
    with pytest.raises(ValueError, match="MemoryTier durable_every must be >= 1"):
        MemoryTier(durable_every=0)
    with pytest.raises(ValueError, match="MemoryTier port must be a TCP port"):
        MemoryTier(port=70000)
    with pytest.raises(ValueError, match="uses \\$LIGHTNING_RESUME_UNSET_VARIABLE"):
        MemoryTier(path="$LIGHTNING_RESUME_UNSET_VARIABLE/x")
    with pytest.raises(TypeError, match="memory must be a MemoryTier or None"):
        DurableCheckpointIO(memory="/dev/shm")  # type: ignore[arg-type]


@case(
    "files the library writes, under a umask of 022 or 077",
    "mode `0666 & ~umask`, like any file `open()` creates (not `mkstemp`'s private 0600)",
)
def file_modes_follow_the_umask(tmp_path: Path) -> None:
    for umask, expected in ((0o022, 0o644), (0o077, 0o600)):
        result = script(
            tmp_path,
            f"""
            import os, stat
            os.umask({umask})
            import lightning.pytorch as pl
            from lightning.pytorch.demos.boring_classes import BoringModel
            from lightning_resume import RequeueCheckpoint, RunDir
            run_dir = RunDir(root={str(tmp_path / f"root{umask}")!r})
            pl.Trainer(max_steps=2, limit_val_batches=0, logger=False, enable_progress_bar=False,
                       callbacks=[run_dir, RequeueCheckpoint(every_n_train_steps=1)],
                       default_root_dir={str(tmp_path)!r}).fit(BoringModel())
            for path in (run_dir.path / "run_meta.json", run_dir.path / "status.json",
                         run_dir.checkpoint_dir / "last.ckpt"):
                print("MODE", path.name, oct(stat.S_IMODE(os.stat(path).st_mode)))
            """,
        )
        modes = {
            line.split()[1]: line.split()[2] for line in result.stdout.splitlines() if line.startswith("MODE")
        }
        names = ("run_meta.json", "status.json", "last.ckpt")
        assert modes == dict.fromkeys(names, oct(expected)), result.stdout + result.stderr


def _committed_steps(run_dir: Path) -> list[Path]:
    return candidates(layout.last_checkpoint(run_dir))


@case(
    "a sharded `last.ckpt` (checkpoint directory) with a shard from another save, torn, or without `meta.pt`",
    "one warning; the restart resumes the newest checkpoint directory that verifies and deletes the bad one",
)
def damaged_sharded_last_checkpoint(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=3)
    bad, previous = _committed_steps(first.path)[:2]
    shard = bytearray((bad / SHARD).read_bytes())
    shard[len(shard) // 2] ^= 0xFF  # same size, other bytes (as a shard of another save): checksums tell
    (bad / SHARD).write_bytes(bytes(shard))
    step = read_manifest(previous).global_step  # type: ignore[union-attr]
    with pytest.warns(UserWarning, match=r"checkpoint directory that did not verify: .*corrupt") as caught:
        _, started, _ = fit_directories(tmp_path, steps=5)
    assert len([w for w in caught if "did not verify" in str(w.message)]) == 1
    assert started.step == step and not bad.exists()


@case(
    "no checkpoint directory of a restarted sharded run verifies",
    "`CheckpointVerificationError` naming each directory and why; nothing is loaded",
)
def no_sharded_checkpoint_verifies(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=3)
    for path in _committed_steps(first.path):
        (path / "meta.pt").unlink()
    with pytest.raises(CheckpointVerificationError, match=r"verifies \(.*incomplete \(meta\.pt is missing\)"):
        fit_directories(tmp_path, steps=5)


@case(
    "`last.ckpt` links to a checkpoint directory that was deleted",
    "`ResumeError` on restart, as for a lost `last.ckpt`; `inspect` reports it `missing`",
)
def dangling_sharded_last_checkpoint(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=2)
    shutil.rmtree(layout.last_checkpoint(first.path).resolve())
    report = json.loads(cli("inspect", first.path, "--json")[1])
    assert report["checkpoints"][0]["result"] == "missing"
    with pytest.raises(ResumeError, match="does not exist although the run has saved checkpoints"):
        fit_directories(tmp_path, steps=4)


@case(
    "a sharded save that fails (a full disk) with a strategy that writes directories",
    "the error is raised; `last.ckpt` still links to the previous checkpoint directory, which verifies",
)
def failed_sharded_save(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="No space left on device"):
        fit_directories(tmp_path, steps=3, strategy=DirectoryStrategy(fail_at_save=2))
    (run_dir,) = (tmp_path / "root").glob(layout.RUN_GLOB)
    verdict = verify(layout.last_checkpoint(run_dir), DIRECTORY)
    assert verdict.status.value == "verified" and verdict.manifest and verdict.manifest.global_step == 1


@case(
    "leftovers of a killed sharded save (`.lr-save-*` of a dead process, a half-deleted `.lr-ckpt-*`)",
    "never loaded; removed by the restart and listed by `lightning-resume gc`",
)
def sharded_save_leftovers(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=2)
    folder = layout.checkpoint_dir(first.path)
    leftovers = [folder / ".lr-save-999999999-0badc0de", folder / ".lr-ckpt-00000009-0000dead"]
    for path in leftovers:
        path.mkdir()
        (path / SHARD).write_bytes(b"half")
        os.utime(path, (0, 0))
    code, out, err = cli("gc", tmp_path / "root", "--older-than", "1d", "--json")
    assert code == 0, err
    assert sorted(Path(r["path"]) for r in json.loads(out)["removals"]) == sorted(leftovers)
    _, started, _ = fit_directories(tmp_path, steps=4)
    assert started.step == 2 and not any(p.exists() for p in leftovers)


@pytest.mark.parametrize("entry", cases_of(__name__), ids=lambda c: c.name)
def test_catalogue(entry: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_case(entry, tmp_path, request)
