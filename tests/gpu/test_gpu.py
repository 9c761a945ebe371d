"""What only a GPU shows: device staging, NCCL collectives, exact resume with the device's random states.

Every check takes a ``device``; the ``cuda`` cases are marked ``gpu`` and skipped without CUDA (see
``conftest.py``), the ``cpu`` cases run the same code in the normal suite (the cheap ones; the others
are ``slow``). The jobs run ``gpu_job.py`` in a process of their own, one device, world size 1:
NCCL on CUDA, gloo on the CPU.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import job_env, same_weights

from lightning_resume import DurableCheckpointIO

JOB = Path(__file__).with_name("gpu_job.py")
CUDA = pytest.mark.gpu


def job(
    root: Path, out: Path, *args: str | int, key: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(JOB), "--root", str(root), "--out", str(out), *map(str, args)]
    return subprocess.run(
        cmd,
        env=job_env(LIGHTNING_RESUME_KEY=key),
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )


def device_state(device: str) -> dict[str, Any]:
    """Weights and optimizer-like state on ``device``: shared storages, a strided view, several dtypes."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(256, 129, generator=g).to(device)
    return {
        "state_dict": {"w": weight, "w_t": weight.t(), "row": weight[3], "b": torch.randn(7).to(device)},
        "half": torch.randn(1000, generator=g).to(device=device, dtype=torch.bfloat16),
        "step": torch.tensor(5, device=device),
        "cpu": torch.arange(10.0),
        "global_step": 5,
    }


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_async_save_of_device_tensors_is_a_snapshot_through_one_reused_buffer(
    tmp_path: Path, device: str
) -> None:
    io = DurableCheckpointIO()
    try:
        for i in range(2):
            state = device_state(device)
            expected = {k: v.cpu().clone() if torch.is_tensor(v) else v for k, v in state.items()}
            expected["state_dict"] = {k: v.cpu().clone() for k, v in state["state_dict"].items()}
            io.save_checkpoint(state, tmp_path / f"{i}.ckpt")
            state["state_dict"]["w"].add_(1)  # training goes on at once: the snapshot must not see it
            state["half"].zero_()
            io.wait_until_durable()
            loaded = torch.load(tmp_path / f"{i}.ckpt", weights_only=True)
            for key, value in expected["state_dict"].items():
                assert torch.equal(loaded["state_dict"][key], value), key
            for key in ("half", "step", "cpu"):
                assert torch.equal(loaded[key], expected[key]) and loaded[key].dtype == expected[key].dtype, (
                    key
                )
            assert loaded["state_dict"]["row"].untyped_storage().data_ptr() == (
                loaded["state_dict"]["w"].untyped_storage().data_ptr()
            )
            buffer = io._route._buffer  # type: ignore[attr-defined]
            if i == 0:
                fd, size = buffer.fd, buffer.size
        assert (buffer.fd, buffer.size) == (fd, size)  # reused, not reallocated
        # CUDA: the shared buffer is page-locked, so the device copies are asynchronous DMA.
        assert buffer._pinned is (device == "cuda")
    finally:
        io.teardown()


def counts(output: str) -> tuple[int, int]:
    found = re.search(r"COLLECTIVES (\d+) GATHERED (\d+)", output)
    assert found, output
    return int(found[1]), int(found[2])


@pytest.mark.parametrize(
    ("device", "strategy"),
    [
        ("cpu", "ddp"),
        pytest.param("cpu", "model_parallel", marks=pytest.mark.slow),
        pytest.param("cuda", "ddp", marks=CUDA),
        pytest.param("cuda", "model_parallel", marks=CUDA),
    ],
)
def test_agreement_gather_and_sigterm_stop_run_on_the_device_backend(
    tmp_path: Path, device: str, strategy: str
) -> None:
    """NCCL rejects CPU tensors; the collectives run here for real although the world has one rank."""
    run = job(
        tmp_path / "root",
        tmp_path / "out.pt",
        "--device",
        device,
        "--strategy",
        strategy,
        "--collectives",
        "--signal-at",
        5,
        key=f"stop-{device}-{strategy}",
    )
    output = run.stdout + run.stderr
    assert run.returncode == 143, output
    assert f"BACKEND {'nccl' if device == 'cuda' else 'gloo'} DEVICE {device}" in output, output
    assert "Preempted by SIGTERM at step 5" in output, output
    collectives, gathered = counts(output)
    assert collectives > 5 and gathered >= 2, output  # an agreement per step, a gather per save
    assert not re.search(r"NCCL (WARN|error)|CUDA error|device-side assert", output), output
    assert list((tmp_path / "root").rglob("last.ckpt")), output


@pytest.mark.parametrize(
    ("device", "strategy"),
    [
        pytest.param("cpu", "ddp", marks=pytest.mark.slow),
        pytest.param("cuda", "ddp", marks=CUDA),
        pytest.param("cuda", "model_parallel", marks=CUDA),
    ],
)
def test_killed_and_restarted_job_ends_with_the_uninterrupted_weights(
    tmp_path: Path, device: str, strategy: str
) -> None:
    """Deterministic algorithms, dropout drawing from the device's generator: bitwise equal weights
    need the model, the optimizer, the data position and every random state (CUDA's) back."""
    args = ("--device", device, "--strategy", strategy, "--steps", 12)
    ref = job(tmp_path / "ref", tmp_path / "ref.pt", *args, key="ref")
    assert ref.returncode == 0, ref.stdout + ref.stderr
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    killed = job(root, out, *args, "--kill-after-step", 7, key="killed")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    resumed = job(root, out, *args, key="killed")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    meta = json.loads(Path(f"{out}.json").read_text())
    assert meta["resumed"] and meta["cuda_rng"] is (device == "cuda")
    assert same_weights(out, tmp_path / "ref.pt")
