"""``StragglerDetector`` on a CUDA device, where the host runs ahead of the GPU: two DDP ranks (gloo) on
one GPU, started as two one-device nodes. Rank 1's backward keeps the GPU busy (``torch.cuda._sleep``:
its host returns at once and only waits later, in DDP's all-reduce), rank 0's loader sleeps on the host.
Host clocks would put rank 1's GPU time in its collective wait; the CUDA events name it compute."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import job_env

CUDA = pytest.mark.gpu


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@CUDA
def test_a_gpu_side_compute_straggler_and_a_host_side_data_straggler_are_named_on_cuda(
    tmp_path: Path,
) -> None:
    out, windows = tmp_path / "named.jsonl", tmp_path / "windows.jsonl"
    args = ["--accelerator", "gpu", "--one-per-node", "--devices", "2", "--steps", "43", "--window", "10"]
    args += [
        "--gpu-sleep",
        "1:0.1",
        "--slow-data",
        "0:0.08",
        "--out",
        str(out),
        "--windows-out",
        str(windows),
    ]
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "jobs.straggler_job", *args],
            env=job_env(
                MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=rank, LOCAL_RANK=0, WORLD_SIZE=2
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    named = [json.loads(line) for line in out.read_text().splitlines()]
    for line in windows.read_text().splitlines():
        print(line)
    print(named)
    assert sorted((s["rank"], s["part"]) for s in named) == [(0, "data"), (1, "compute")], named
    compute = next(s for s in named if s["rank"] == 1)
    assert 0.08 < compute["seconds"] < 0.2 and compute["waited"] < compute["others_waited"], compute
