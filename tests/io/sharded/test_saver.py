"""Sharded checkpoints end to end: 2-rank ``ModelParallelStrategy`` (FSDP2) jobs on CPU, killed and restarted.

Every job is ``tests/jobs/sharded_job.py`` in a process group of its own, relaunched as a restart of
the same session. Weights are compared bitwise with the reference run's dumps at the exact step a
restart resumed from, and with its final weights.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from _s3 import moto_endpoint, new_bucket, s3_options
from conftest import job_env, same_weights

from lightning_resume import CheckpointVerificationError, DurableCheckpointIO, Mirror
from lightning_resume._storage.catalog import Status, candidates, verify
from lightning_resume._storage.kinds import DIRECTORY, MANIFEST_NAME
from lightning_resume.io.sharded.choice import prepare_resume
from lightning_resume.io.sharded.parts import list_files, read_manifest
from lightning_resume.run_dir import attempts, layout

JOB = "jobs.sharded_job"
KEY = "sharded"
PREEMPTED = 143


@dataclass
class Attempt:
    returncode: int
    output: str
    loaded_step: int | None
    first_step: int | None


def run(
    root: Path,
    out: Path,
    *args: str | int,
    loaded: Path | None = None,
    timeout: float = 420,
    env: dict[str, str | int | None] | None = None,
) -> Attempt:
    """One launch of the job, by default under session key ``KEY`` (a restart once it has a run dir)."""
    cmd = [sys.executable, "-m", JOB, "--root", str(root), "--out", str(out), *map(str, args)]
    if loaded is not None:
        cmd += ["--loaded", str(loaded)]
    proc = subprocess.run(
        cmd,
        env=job_env(**(env if env is not None else {"LIGHTNING_RESUME_KEY": KEY})),
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,  # the job kills its own process group (every rank)
    )
    record = Path(f"{loaded}.json") if loaded is not None else None
    step = json.loads(record.read_text())["global_step"] if record is not None and record.exists() else None
    meta = Path(f"{out}.json")
    first = json.loads(meta.read_text())["first_step"] if proc.returncode == 0 and meta.exists() else None
    return Attempt(proc.returncode, proc.stdout + proc.stderr, step, first)


@dataclass
class Reference:
    """The uninterrupted run: final weights, the weights at every save, and its run dir."""

    root: Path
    final: Path
    refs: Path

    def at(self, step: int) -> Path:
        return self.refs / f"step{step}.pt"

    @property
    def checkpoints(self) -> Path:
        (run_dir,) = self.root.glob(layout.RUN_GLOB)
        return layout.checkpoint_dir(run_dir)


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    folder = tmp_path_factory.mktemp("sharded-reference")
    ref = Reference(folder / "root", folder / "final.pt", folder / "refs")
    ref.refs.mkdir()
    attempt = run(ref.root, ref.final, "--refs", ref.refs)
    assert attempt.returncode == 0, attempt.output[-4000:]
    # Saves every 3 steps and at the end of each of the 2 epochs of 8 steps.
    assert sorted(int(p.stem[4:]) for p in ref.refs.glob("step*.pt")) == [3, 6, 8, 9, 12, 15, 16]
    return ref


def copy_run(reference: Reference, root: Path) -> Path:
    """A copy of the reference root whose session index points at the copied run dir; returns it."""
    shutil.copytree(reference.root, root, symlinks=True)
    (run_dir,) = root.glob(layout.RUN_GLOB)
    (index,) = (root / layout.INDEX_DIR).iterdir()
    index.write_text(f"{run_dir}\n")
    return run_dir


def chain(
    tmp_path: Path,
    reference: Reference,
    plan: list[tuple[list[str], set[int]]],
    before_last: Callable[[Path], set[int]] | None = None,
) -> list[Attempt]:
    """Run ``plan``: each launch's extra arguments and the steps its restart may resume from.

    Launches are a SLURM job and its requeues (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``). Every
    restart must resume (first step > 0) from an allowed step with the weights the reference had at
    that step; the last launch (no extra arguments, after ``before_last(run dir)``, which returns the
    steps it may then resume from) must finish with the reference's final weights, in one run dir.
    """
    root, out = tmp_path / "root", tmp_path / "final.pt"
    attempts = []
    allowed: set[int] | None = None
    for number, (args, resumable) in enumerate([*plan, ([], set())]):
        last = number == len(plan)
        if last and before_last is not None:
            (run_dir,) = root.glob(layout.RUN_GLOB)
            allowed = before_last(run_dir)
        loaded = tmp_path / f"loaded{number}"
        slurm = {"SLURM_JOB_ID": 4343, "SLURM_RESTART_COUNT": number or None}
        attempt = run(root, out, *args, loaded=loaded, env=slurm)
        attempts.append(attempt)
        where = f"launch {number} {args}: rc {attempt.returncode}\n{attempt.output[-4000:]}"
        assert attempt.returncode == (0 if last else -9), where
        if allowed is not None:
            assert attempt.loaded_step in allowed, where
            assert same_weights(Path(f"{loaded}.pt"), reference.at(attempt.loaded_step)), where
        allowed = resumable
    assert len(list(root.glob(layout.RUN_GLOB))) == 1
    assert attempts[-1].first_step and attempts[-1].first_step > 0
    assert same_weights(out, reference.final)
    return attempts


def mix_shards(run_dir: Path) -> tuple[str, int]:
    """Give last.ckpt's directory rank 0's shard of the save before (same size, another step).

    Returns:
        The damaged directory's name, and the step of the one a restart falls back to.
    """
    last = layout.last_checkpoint(run_dir)
    previous = candidates(last)[1]
    shutil.copy(previous / "__0_0.distcp", last / "__0_0.distcp")
    manifest = read_manifest(previous)
    assert manifest is not None and manifest.global_step is not None
    return last.resolve().name, manifest.global_step


@pytest.mark.slow
def test_sigkills_at_random_steps_and_inside_saves_resume_exactly_and_a_damaged_save_falls_back(
    tmp_path: Path, reference: Reference
) -> None:
    # Saves commit at steps 3, 6, 8 (epoch end), 9, 12, 15 and 16. Three SIGKILLs between steps (each
    # comes before the save of its own step: the restart resumes from the newest save before it, or,
    # with asynchronous saves, the one before that if the newest was still being written), three
    # inside saves (inside DCP's write; committed but not pointed at; pointed at but the old one not
    # deleted), alternating synchronous and asynchronous (DurableCheckpointIO) saves. Before the last
    # launch, last.ckpt's directory gets a shard of the save before it: the restart falls back.
    rng = random.Random(int(os.environ.get("LIGHTNING_RESUME_TEST_SEED", "14")))
    k1, k2, k3 = rng.choice([7, 8]), rng.choice([10, 11]), rng.choice([13, 14])
    plan = [
        (["--durable", "--kill-after-step", str(k1)], {6, 3}),
        (["--kill-point", "before_metadata@9"], {8}),
        (["--durable", "--kill-after-step", str(k2)], {9, 8}),
        (["--durable", "--kill-point", "before_swap@12"], {9}),
        (["--kill-after-step", str(k3)], {12}),
        (["--kill-point", "after_swap@15"], {15}),
    ]
    mixed: list[str] = []

    def damage(run_dir: Path) -> set[int]:
        name, step = mix_shards(run_dir)
        mixed.append(name)
        return {step}

    attempts = chain(tmp_path, reference, plan, before_last=damage)
    assert all(a.loaded_step for a in attempts[1:]), (k1, k2, k3)
    fallback = attempts[-1]
    assert fallback.loaded_step == 12, fallback.output[-4000:]
    assert fallback.output.count("that did not verify") == 1, fallback.output[-4000:]
    assert f"{mixed[0]}: corrupt (__0_0.distcp does not match its checksum)" in fallback.output


# A save is killed at each point, in turn; the saves of steps 3, 6, 8, 9, 12, 15 and 16 commit in order.
POINTS = [
    ("after_own_shard", 6, {3}),  # rank 1's shard written
    ("before_metadata", 8, {6}),  # every shard written, DCP's .metadata not
    ("before_meta_pt", 9, {8}),  # .metadata in place, Lightning's meta.pt not
    ("before_manifest", 12, {9}),  # every file written and fsynced
    ("before_rename", 12, {9}),  # the manifest written
    ("before_swap", 12, {9}),  # committed under its final name, last.ckpt not yet swapped
    ("after_swap", 12, {12}),  # last.ckpt names the new directory, the old one not yet deleted
    ("mid_delete", 15, {15}),  # the old directory half deleted
]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_kill_at_every_point_of_a_save_resumes_from_the_old_or_the_new_step(
    tmp_path: Path, reference: Reference, mode: str
) -> None:
    flags = ["--durable"] if mode == "async" else []
    chain(tmp_path, reference, [([*flags, "--kill-point", f"{p}@{s}"], steps) for p, s, steps in POINTS])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    yield from moto_endpoint()


def test_sigterm_to_one_rank_stops_every_rank_with_a_durable_mirrored_sharded_checkpoint(
    tmp_path: Path, s3_endpoint: str
) -> None:
    mirror = f"s3://{new_bucket(s3_endpoint)}/run"
    root, out = tmp_path / "root", tmp_path / "final.pt"
    args = ["--durable", "--mirror", mirror, "--mirror-endpoint", s3_endpoint]
    attempt = run(root, out, *args, "--preempt-rank", 1, "--preempt-step", 10)
    assert attempt.returncode == PREEMPTED, attempt.output[-4000:]
    assert "Preempted by a signal on another rank at step 10" in attempt.output
    (run_dir,) = root.glob(layout.RUN_GLOB)
    last = layout.last_checkpoint(run_dir)
    verdict = verify(last, DIRECTORY)
    assert verdict.status is Status.VERIFIED and verdict.manifest is not None
    assert verdict.manifest.global_step == 10  # durable before the exit: what PreemptionHandler waits for

    # The mirror holds it too: restore onto an empty node-local directory.
    empty = tmp_path / "node2" / "checkpoints"
    DurableCheckpointIO(mirror=Mirror(mirror, s3_options(s3_endpoint)), dirpath=empty)
    restored = empty / layout.LAST_CKPT
    assert verify(restored, DIRECTORY).status is Status.VERIFIED
    assert os.readlink(restored) == os.readlink(last)
    files = list_files(last)
    assert files == list_files(restored)
    assert all((last / f).read_bytes() == (restored / f).read_bytes() for f in files)


@pytest.mark.slow
def test_a_restart_falls_back_from_mixed_shards_with_one_warning(
    tmp_path: Path, reference: Reference
) -> None:
    run_dir = copy_run(reference, tmp_path / "root")
    bad, _ = mix_shards(run_dir)
    loaded = tmp_path / "loaded"
    attempt = run(tmp_path / "root", tmp_path / "final.pt", "--epochs", 3, loaded=loaded)
    assert attempt.returncode == 0, attempt.output[-4000:]
    assert attempt.output.count("that did not verify") == 1, attempt.output[-4000:]
    assert f"{bad}: corrupt (__0_0.distcp does not match its checksum)" in attempt.output
    assert attempt.loaded_step == 15
    assert same_weights(Path(f"{loaded}.pt"), reference.at(15))
    assert not (run_dir / "checkpoints" / bad).exists()


def in_process_trainer(tmp_path: Path) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, default_root_dir=tmp_path)


def damage(path: Path, kind: str) -> None:
    if kind == "truncated shard":
        with open(path / "__1_0.distcp", "r+b") as f:
            f.truncate(100)
    elif kind == "missing .metadata":
        (path / ".metadata").unlink()
    elif kind == "missing meta.pt":
        (path / "meta.pt").unlink()
    elif kind == "corrupt manifest":
        (path / MANIFEST_NAME).write_text('{"format": "lightning-resume/directory-manifest"')
    elif kind == "mixed shards":
        data = bytearray((path / "__1_0.distcp").read_bytes())
        data[-1] ^= 1
        (path / "__1_0.distcp").write_bytes(bytes(data))


FAULTS = ["mixed shards", "truncated shard", "missing .metadata", "missing meta.pt", "corrupt manifest"]


@pytest.mark.parametrize("kind", FAULTS)
def test_a_damaged_sharded_last_ckpt_is_never_chosen(tmp_path: Path, reference: Reference, kind: str) -> None:
    # The restart's choice (every rank's share of the checksums; here one rank does it all) on the real
    # DCP directories of the reference run.
    folder = tmp_path / "checkpoints"
    shutil.copytree(reference.checkpoints, folder, symlinks=True)
    last = folder / layout.LAST_CKPT
    damage(last.resolve(), kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        choice = prepare_resume(in_process_trainer(tmp_path), last, keep=2)
    skipped = [str(w.message) for w in caught if "that did not verify" in str(w.message)]
    assert len(skipped) == 1, [str(w.message) for w in caught]
    assert choice.manifest is not None and choice.manifest.global_step == 15
    assert last.resolve() == choice.path.resolve()


def test_no_verified_sharded_checkpoint_is_a_clear_error(tmp_path: Path, reference: Reference) -> None:
    folder = tmp_path / "checkpoints"
    shutil.copytree(reference.checkpoints, folder, symlinks=True)
    for path in candidates(folder / layout.LAST_CKPT):
        damage(path, "truncated shard")
    with pytest.raises(CheckpointVerificationError, match=r"no checkpoint directory .* verifies \(.*torn"):
        prepare_resume(in_process_trainer(tmp_path), folder / layout.LAST_CKPT, keep=2)


def test_a_two_rank_sharded_checkpoint_resumes_on_one_rank_and_says_so(
    tmp_path: Path, reference: Reference
) -> None:
    copy_run(reference, tmp_path / "root")
    loaded = tmp_path / "loaded"
    attempt = run(tmp_path / "root", tmp_path / "final.pt", "--devices", 1, "--epochs", 3, loaded=loaded)
    assert attempt.returncode == 0, attempt.output[-4000:]
    assert "written by 2 rank(s), on 1 rank(s)" in attempt.output
    assert attempt.loaded_step == 16
    assert same_weights(Path(f"{loaded}.pt"), reference.at(16))  # resharded by DCP, bitwise equal


@pytest.mark.slow
def test_a_one_rank_sharded_checkpoint_resumes_on_two_ranks(tmp_path: Path) -> None:
    root, refs = tmp_path / "root", tmp_path / "refs"
    refs.mkdir()
    first = run(root, tmp_path / "final.pt", "--devices", 1, "--refs", refs, "--kill-after-step", 7)
    assert first.returncode == -9, first.output[-4000:]
    loaded = tmp_path / "loaded"
    again = run(root, tmp_path / "final.pt", "--devices", 2, loaded=loaded)
    assert again.returncode == 0, again.output[-4000:]
    assert "written by 1 rank(s), on 2 rank(s)" in again.output
    assert again.loaded_step == 6
    assert same_weights(Path(f"{loaded}.pt"), refs / "step6.pt")


def test_the_job_compares_weights_bitwise(tmp_path: Path, reference: Reference) -> None:
    # The checks above are only as good as the comparison: one changed bit must show.
    weights = torch.load(reference.final)
    name = next(iter(weights))
    weights[name].view(-1).view(torch.int32)[0] ^= 1
    torch.save(weights, tmp_path / "changed.pt")
    assert not same_weights(reference.final, tmp_path / "changed.pt")


@pytest.mark.slow
def test_auto_cadence_times_background_sharded_saves_until_their_commit(tmp_path: Path) -> None:
    """The sharded saver, not the plugin, says when an asynchronous save is durable: ``"auto"`` learns
    the time to durable from its commits and chooses an interval (it waited for the plugin forever)."""
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    job = run(root, out, "--durable", "--every", "auto", "--epochs", "8")
    assert job.returncode == 0, job.output[-3000:]
    (attempt,) = attempts.read(layout.run_dirs(root)[0]).attempts
    saves = attempt.last_ckpt_saves
    assert saves.count >= 2 and saves.durable_count >= 1, saves
    # the stall plus the write in the background (the first save's stall pays one-time costs: compare
    # with the steady ones)
    steady = saves.later.mean
    assert steady is not None and saves.max_to_durable > steady
    assert attempt.cadence is not None and attempt.cadence["to_durable"] > attempt.cadence["save_stall"]
