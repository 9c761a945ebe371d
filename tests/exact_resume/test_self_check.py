"""The resume's self-check: a correct resume says "exact", a broken one is caught and named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import run_job, same_weights

from lightning_resume.exact_resume import self_check
from lightning_resume.run_dir import layout

WARNING = "Resume self-check"


def verdicts(root: Path) -> list[str | None]:
    (attempts,) = layout.run_files(root, layout.ATTEMPTS)
    return [a.get("self_check") for a in json.loads(attempts.read_text())["attempts"]]


def killed_and_resumed(tmp_path: Path, *args: str) -> str:
    """Kill at step 8, before its save (last.ckpt of step 6; the record of step 7 whole), relaunch; the
    relaunch's output."""
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    killed = run_job(root, out, "--loader", "plain", "--kill-at", "8", *args, SLURM_JOB_ID="31")
    assert killed.returncode == -9, killed.output
    resumed = run_job(root, out, "--loader", "plain", *args, SLURM_JOB_ID="31", SLURM_RESTART_COUNT=1)
    assert resumed.returncode == 0, resumed.output
    return resumed.output


def test_a_correct_resume_says_it_is_exact(tmp_path: Path, baseline: dict[str, Path]) -> None:
    output = killed_and_resumed(tmp_path)
    assert WARNING not in output
    assert "resume self-check after step 6: exact" in output
    assert verdicts(tmp_path / "runs") == [
        None,
        "exact (checked: batch, grads, modes, optimizers, outcome, position, rng, trainable)",
    ]
    assert same_weights(tmp_path / "out.pt", baseline["plain"])


@pytest.mark.parametrize(
    ("sabotage", "named"),
    [
        ("frozen", "trainable: 3 of 4 parameters are trainable, 4 were"),
        ("batch-off", "batch: the batch differs"),
    ],
)
def test_a_broken_resume_is_caught_and_named(tmp_path: Path, sabotage: str, named: str) -> None:
    output = killed_and_resumed(tmp_path, "--sabotage", sabotage)
    warnings = [line for line in output.splitlines() if WARNING in line]
    assert len(warnings) == 1, output  # once
    assert named in warnings[0] and "What to do" in warnings[0]
    assert verdicts(tmp_path / "runs")[-1] == f"differs: {named.split(':')[0]}"


def test_fingerprints_differ_in_what_changed() -> None:
    a = {"position": [3, 0, 3], "trainable": [4, 4, "x"], "grads": [True, True], "rng": "r"}
    b = {"position": [3, 0, 0], "trainable": [1, 4, "y"], "grads": [True, False], "rng": "r"}
    found = self_check.differences(a, b, self_check.AT_SAVE)
    assert [line.split(":")[0] for line in found] == ["position", "trainable", "grads"]
    assert "batch) is (3, 0, 0), the interrupted run was at (3, 0, 3)" in found[0]
    assert self_check.verdict([found, []], self_check.AT_SAVE) == "differs: grads, position, trainable"
    assert "(rank 0)" in self_check.message(3, [found, []])


def test_batch_digests_see_every_sample_and_not_the_device() -> None:
    batch = {"x": torch.arange(10_000.0).reshape(100, 100), "y": [torch.tensor([1, 2]), "label"]}
    same = {"x": torch.arange(10_000.0).reshape(100, 100), "y": [torch.tensor([1, 2]), "label"]}
    assert self_check.batch_digest(batch) == self_check.batch_digest(same)
    same["x"][99, 99] += 1  # the last element is always sampled; shapes too
    assert self_check.batch_digest(batch) != self_check.batch_digest(same)
    assert self_check.batch_digest(torch.zeros(4, 2)) != self_check.batch_digest(torch.zeros(2, 4))


@pytest.mark.parametrize("handler", ["preemption_handler", pytest.param("lightning", marks=pytest.mark.slow)])
def test_after_a_sigterm_stop_the_restart_compares_its_first_batch(
    tmp_path: Path, baseline: dict[str, Path], handler: str
) -> None:
    """A stop runs no step after its save: the save takes the batch the next step trains on from the
    loader, and the restart's first step compares it (a data-position error there would be seen)."""
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    args = ["--loader", "plain", "--key", "stopped", *(["--preemption"] if handler != "lightning" else [])]
    stopped = run_job(root, out, *args, "--signal-at", "7")
    assert stopped.returncode == (143 if handler != "lightning" else 0), stopped.output
    resumed = run_job(root, out, *args)
    assert resumed.returncode == 0, resumed.output
    assert WARNING not in resumed.output
    verdict = verdicts(root)[-1]
    assert verdict is not None and verdict.startswith("exact (checked: batch,"), verdict
    assert same_weights(out, baseline["plain"])
