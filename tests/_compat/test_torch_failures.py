"""Pin of ``_compat.torch.failure_in_torch_terms`` against the installed torch: real errors of each kind
(the CPU allocator, anomaly mode, a non-finite norm, a dataset and a DataLoader worker, gloo's closed
connection and timeout between two real processes) are told by their type, message or frames."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resume._compat.torch import failure_in_torch_terms
from lightning_resume.failure_classes import FailureClass

pytestmark = pytest.mark.edge  # run again on the lowest Lightning and torch declared

#: Two gloo ranks; rank 1 leaves the second all-reduce ("exit": its process ends; "sleep": past the
#: group's 2 s timeout); rank 0 prints the class of the error it gets.
GLOO = """
import datetime, os, sys, time, torch, torch.distributed as dist
from lightning_resume._compat.torch import failure_in_torch_terms
rank, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=2))
dist.all_reduce(torch.ones(1))
if rank == 1:
    os._exit(0) if mode == "exit" else time.sleep(4)
try:
    dist.all_reduce(torch.ones(1))
except RuntimeError as e:
    print("CLASS", failure_in_torch_terms(e).value, "|", str(e).splitlines()[0])
"""


def raised(make: Callable[[], object]) -> BaseException:
    try:
        make()
    except BaseException as e:
        return e
    raise AssertionError(f"{make!r} raised nothing")


class Unreadable(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        raise ValueError(f"sample {index} cannot be read")


def nan_backward() -> None:
    x = torch.ones(2, requires_grad=True)
    with torch.autograd.detect_anomaly():
        (x * float("nan")).sum().backward()


def clip_infinite_gradient() -> None:
    weight = torch.nn.Parameter(torch.ones(1))
    weight.grad = torch.tensor([float("inf")])
    torch.nn.utils.clip_grad_norm_([weight], 1.0, error_if_nonfinite=True)


def cuda_oom() -> None:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: torch.empty(2**55, dtype=torch.uint8), FailureClass.OUT_OF_MEMORY),
        (cuda_oom, FailureClass.OUT_OF_MEMORY),
        (nan_backward, FailureClass.NON_FINITE),
        (clip_infinite_gradient, FailureClass.NON_FINITE),
        (lambda: next(iter(DataLoader(Unreadable()))), FailureClass.DATA),
        (lambda: next(iter(DataLoader(Unreadable(), num_workers=1))), FailureClass.DATA),
        (lambda: torch.ones(2) @ torch.ones(3), None),
    ],
    ids=["cpu-allocator", "cuda-oom", "anomaly-nan", "clip-nonfinite", "dataset", "worker", "shape-error"],
)
def test_real_errors_of_torch_are_told_by_their_class(
    make: Callable[[], object], expected: FailureClass | None
) -> None:
    assert failure_in_torch_terms(raised(make)) is expected


@pytest.mark.parametrize("mode", ["exit", "sleep"])
def test_a_real_gloo_collective_with_a_peer_gone_or_too_slow_is_a_communication_error(
    tmp_path: Path, mode: str
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), port, mode], stdout=subprocess.PIPE, text=True
        )
        for rank in (0, 1)
    ]
    out, _ = (p.communicate(timeout=120)[0] for p in ranks)  # rank 0's, once both ended
    assert "CLASS communication |" in out, out
    # A peer gone: "Connection closed by peer" or "Read error ...: Connection reset by peer".
    assert ("by peer" if mode == "exit" else "Timed out waiting") in out, out
