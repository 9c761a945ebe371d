"""The restart rule knows every tier: with the run's ``checkpoints/`` folder lost after it saved, a
restart resumes from the newest committed copy the node's memory tier or the mirror holds, exactly;
with no copy anywhere it raises ``ResumeError`` naming what is missing, never a silent start over, and
the line that ends ``fit`` states that rule. (Two nodes, one lost: ``tests/cluster/test_memory_tier.py``.)"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from bad_inputs import first_run, restart
from conftest import held_step, run_job, same_weights

from lightning_resume import ResumeError
from lightning_resume.run_dir import layout, save_record

#: Saves every 2 steps; the job SIGKILLs itself after step 9: its newest save is step 8, or step 6 when
#: the kill lands while step 8 is still being written (an asynchronous save, or a mirror upload).
KILL_AT = 9


def killed_then_folder_lost(tmp_path: Path, *args: str) -> Path:
    """The job killed after :data:`KILL_AT`, then its run dir's ``checkpoints/`` folder deleted."""
    root = tmp_path / "runs"
    first = run_job(
        root, tmp_path / "out.pt", "--loader", "plain", *args, "--kill-at", KILL_AT, LIGHTNING_RESUME_KEY="t"
    )
    assert first.returncode != 0, first.output
    (run_dir,) = layout.run_dirs(root)
    assert save_record.read(run_dir).committed
    shutil.rmtree(layout.checkpoint_dir(run_dir))
    return root


def relaunched(tmp_path: Path, root: Path, *args: str) -> str:
    again = run_job(root, tmp_path / "out.pt", "--loader", "plain", *args, LIGHTNING_RESUME_KEY="t")
    assert again.returncode == 0, again.output
    return again.output


def test_a_lost_checkpoint_folder_resumes_from_node_memory_exactly(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    # The durable tier has the first save only (step 2): the memory tier alone holds step 8.
    memory = ("--memory", str(tmp_path / "shm"), "--replicas", "0", "--durable-every", "1000")
    root = killed_then_folder_lost(tmp_path, *memory)
    (copy,) = (tmp_path / "shm").glob("*/node-0/last.ckpt")
    saved_at = held_step(copy)
    assert saved_at in (6, 8)
    output = relaunched(tmp_path, root, *memory)
    assert f"(step {saved_at}) from the memory tier of node 0" in output, output
    assert f"FIRST_STEP rank=0 step={saved_at}" in output
    assert same_weights(tmp_path / "out.pt", baseline["plain"])


def test_a_lost_checkpoint_folder_resumes_from_the_mirror_exactly(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    mirror = tmp_path / "mirror"
    root = killed_then_folder_lost(tmp_path, "--mirror", f"file://{mirror}")
    saved_at = held_step(mirror / "last.ckpt")  # what the uploads had reached
    output = relaunched(tmp_path, root, "--mirror", f"file://{mirror}")
    assert f"FIRST_STEP rank=0 step={saved_at}" in output, output
    assert same_weights(tmp_path / "out.pt", baseline["plain"])


def test_a_lost_checkpoint_folder_with_no_copy_anywhere_raises_and_the_stop_line_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = first_run(tmp_path)
    shutil.rmtree(layout.checkpoint_dir(run_dir))
    with caplog.at_level(logging.WARNING, logger="lightning_resume"), pytest.raises(ResumeError) as lost:
        restart(tmp_path)
    last = str(layout.last_checkpoint(run_dir))
    assert f"{last!r} does not exist although the run has saved checkpoints" in str(lost.value)
    assert str(layout.saves_record(run_dir)) in str(lost.value)
    (stop,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fit stopped by")]
    assert f"{last} is missing although the run saved checkpoints, so a restart raises ResumeError" in stop
    assert not layout.last_checkpoint(run_dir).exists()  # nothing was trained from step 0 meanwhile
