"""``DurableCheckpointIO(memory=MemoryTier(...))`` in a real training job on one node, killed and
restarted: the restart loads the newest save from node memory, exactly; without that copy (a fresh
node), or with a damaged one, it loads the durable tier, exactly; a preemption's save and the end of
training reach the durable tier. (Several nodes: ``tests/cluster/test_memory_tier.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import held_step, run_job, same_weights

from lightning_resume._storage.catalog import check_file
from lightning_resume._storage.manifest import read_entries
from lightning_resume.run_dir import attempts, layout

#: Saves every 2 steps; the job SIGKILLs itself after step 9: its newest save is step 8, or step 6 when
#: the kill lands while the asynchronous save of step 8 is still being written.
KILL_AT = 9
ARGS = ("--loader", "plain")


def memory_args(tier: Path) -> tuple[str, ...]:
    # The durable tier gets the first save only (step 2), until the end or a preemption.
    return (*ARGS, "--memory", str(tier), "--durable-every", "1000")


def durable_step(root: Path) -> int | None:
    (run_dir,) = layout.run_dirs(root)
    verdict = check_file(layout.last_checkpoint(run_dir))
    assert verdict.manifest is not None, verdict
    return verdict.manifest.global_step


def killed(tmp_path: Path, tier: Path) -> tuple[Path, int]:
    """The job killed after :data:`KILL_AT`: its run root, and the step of the save node memory holds."""
    root = tmp_path / "runs"
    first = run_job(
        root, tmp_path / "out.pt", *memory_args(tier), "--kill-at", KILL_AT, LIGHTNING_RESUME_KEY="m"
    )
    assert first.returncode != 0, first.output
    assert durable_step(root) == 2
    (held,) = tier.glob("*/node-0/last.ckpt")
    saved_at = held_step(held)
    assert saved_at in (6, 8)
    assert torch.load(held, weights_only=False)["global_step"] == saved_at
    return root, saved_at


def restarted_exactly(
    tmp_path: Path, root: Path, tier: Path, baseline: Path, *args: str, key: str = "m"
) -> str:
    """Run the job again to its end; its output, once its weights equal the uninterrupted run's."""
    again = run_job(root, tmp_path / "out.pt", *memory_args(tier), *args, LIGHTNING_RESUME_KEY=key)
    assert again.returncode == 0, again.output
    assert same_weights(tmp_path / "out.pt", baseline)
    return again.output


def test_a_restart_loads_the_newest_save_from_node_memory_and_ends_exact(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    tier = tmp_path / "shm"
    root, saved_at = killed(tmp_path, tier)
    again = run_job(root, tmp_path / "out.pt", *memory_args(tier), LIGHTNING_RESUME_KEY="m")
    assert again.returncode == 0, again.output
    assert f"(step {saved_at}) from the memory tier of node 0" in again.output, again.output
    assert f"FIRST_STEP rank=0 step={saved_at}" in again.output
    assert same_weights(tmp_path / "out.pt", baseline["plain"])
    assert durable_step(root) == 36  # the end of training reached the durable tier
    (run_dir,) = layout.run_dirs(root)
    restore = attempts.read(run_dir).attempts[-1].restore or {}
    assert (restore["tier"], restore["node"], restore["step"]) == ("memory", 0, saved_at)
    assert restore["bytes"] > 0


@pytest.mark.slow
def test_without_a_memory_copy_the_restart_loads_the_durable_tier_and_ends_exact(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    tier = tmp_path / "shm"
    root, _ = killed(tmp_path, tier)
    for path in sorted(tier.rglob("*"), reverse=True):  # a fresh node: its memory is empty
        path.unlink() if path.is_file() else path.rmdir()
    output = restarted_exactly(tmp_path, root, tier, baseline["plain"])
    assert "(step 2) from the durable tier" in output, output
    assert "FIRST_STEP rank=0 step=2" in output


def test_a_damaged_memory_copy_is_never_loaded(tmp_path: Path, baseline: dict[str, Path]) -> None:
    tier = tmp_path / "shm"
    root, saved_at = killed(tmp_path, tier)
    (held,) = tier.glob("*/node-0/last.ckpt")
    data = bytearray(held.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    held.write_bytes(bytes(data))
    output = restarted_exactly(tmp_path, root, tier, baseline["plain"])
    assert f"no rank could load the memory copy of last.ckpt (step {saved_at}" in output, output
    assert "(step 2) from the durable tier" in output


@pytest.mark.slow
def test_a_preemptions_save_goes_to_the_durable_tier(tmp_path: Path, baseline: dict[str, Path]) -> None:
    tier, root = tmp_path / "shm", tmp_path / "runs"
    args = (*memory_args(tier), "--preemption")
    # SIGTERM in step 9 (saves every 2 steps: step 8 is the newest one in memory only)
    first = run_job(root, tmp_path / "out.pt", *args, "--signal-at", "8", LIGHTNING_RESUME_KEY="p")
    assert first.returncode != 0, first.output
    assert "Preempted by SIGTERM at step 9" in first.output, first.output
    assert durable_step(root) == 9  # the save at the signal, written straight to the durable tier
    again = run_job(root, tmp_path / "out.pt", *args, LIGHTNING_RESUME_KEY="p")
    assert again.returncode == 0, again.output
    assert "(step 9) from the durable tier" in again.output, again.output
    assert same_weights(tmp_path / "out.pt", baseline["plain"])


@pytest.mark.parametrize("durable_every", [1, 3])
def test_the_durable_tier_gets_the_first_every_kth_and_the_last_save(
    tmp_path: Path, durable_every: int
) -> None:
    tier, root = tmp_path / "shm", tmp_path / "runs"
    args = (*ARGS, "--memory", str(tier), "--durable-every", str(durable_every), "--epochs", "1")
    # One epoch of 12 steps, saved every 2: saves 1 to 6 at steps 2 to 12.
    done = run_job(root, tmp_path / "out.pt", *args, LIGHTNING_RESUME_KEY="k")
    assert done.returncode == 0, done.output
    (run_dir,) = layout.run_dirs(root)
    versions = read_entries(layout.last_checkpoint(run_dir)) or []  # its three newest versions
    assert [entry.global_step for entry in versions] == ([12, 10, 8] if durable_every == 1 else [12, 8, 2])
