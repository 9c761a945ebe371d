"""Collectives go through Lightning's strategy, with tensors on the strategy's device.

NCCL, Lightning's backend for CUDA DDP, rejects CPU tensors; gloo accepts them, so no CPU run can
show the bug. Two checks stand in for a GPU: no module but ``_collectives`` runs a collective, and a
strategy whose root device is not the CPU receives every tensor on its own device. The one collective
not run through the strategy is a gather on a gloo group of our own (writer threads off training).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy

import lightning_resume
from lightning_resume import _collectives
from lightning_resume.exact_resume import rng

PACKAGE = Path(lightning_resume.__file__).parent
# torch.distributed's collectives, and the strategy methods that run one.
TORCH_COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "barrier",
    "all_to_all",
    "send",
    "recv",
}
OWN_GROUP = " (on a group of its own)"
STRATEGY_COLLECTIVES = {"all_gather", "broadcast", "barrier", "reduce", "reduce_boolean_decision"}


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def collective_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name = dotted(node.func)
        base, method = name.rsplit(".", 1)
        raw = method in TORCH_COLLECTIVES and base in ("torch.distributed", "dist", "distributed")
        through_strategy = method in STRATEGY_COLLECTIVES and base.endswith("strategy")
        own_group = raw and any(k.arg == "group" for k in node.keywords)
        if raw or through_strategy:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}{OWN_GROUP if own_group else ''}")
    return found


def test_no_module_but_collectives_runs_a_collective() -> None:
    elsewhere = [
        call
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_collectives.py"
        for call in collective_calls(path)
    ]
    assert not elsewhere, "collectives outside lightning_resume/_collectives.py:\n" + "\n".join(elsewhere)


def test_collectives_module_never_calls_torch_distributed_directly() -> None:
    calls = collective_calls(PACKAGE / "_collectives.py")
    # The one exception: a gather on a gloo group of our own (``cpu_group``), for writer threads that must
    # not touch the training's group; gloo takes CPU tensors, whatever device training uses.
    assert calls and all(
        ".strategy" in call or " strategy." in call or call.endswith(OWN_GROUP) for call in calls
    ), calls
    assert len([call for call in calls if call.endswith(OWN_GROUP)]) == 1, calls


class RecordingStrategy(DDPStrategy):
    """A 2-rank DDP strategy whose collectives only record the device of what they are handed.

    Its root device is ``meta``: no tensor created on the CPU can pass for it. ``replies`` are what
    the transport returns (computed on the CPU by the test), since meta tensors carry no data.
    """

    def __init__(self, replies: list[torch.Tensor] | None = None) -> None:
        super().__init__(accelerator=None)
        self.devices: list[torch.device] = []
        self.replies = list(replies or [])

    @property
    def root_device(self) -> torch.device:
        return torch.device("meta")

    @property
    def world_size(self) -> int:
        return 2

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        self.devices.append(tensor.device)
        return torch.tensor(1)  # one of the two ranks got a signal

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        self.devices.append(tensor.device)
        return self.replies.pop(0)


class LoopbackStrategy(RecordingStrategy):
    """The same on the CPU, where every rank holds the same value: all-gather stacks two copies."""

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu")

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        self.devices.append(tensor.device)
        reply = torch.stack([tensor, tensor])
        self.replies.append(reply)
        return reply


def test_the_agreement_puts_its_flag_on_the_strategy_device() -> None:
    strategy = RecordingStrategy()
    assert _collectives.any_rank(strategy, False) is True  # the other rank's signal counts
    assert strategy.devices == [torch.device("meta")]


@pytest.mark.parametrize("extra", [0, 200_000], ids=["one all-gather", "sizes then bytes"])
def test_the_rng_gather_puts_every_tensor_on_the_strategy_device(extra: int) -> None:
    state = {
        "rng": rng.capture(),
        "draws": [{"iterator": None, "sampler": {"generator": torch.Generator().get_state()}}],
        "padding": b"x" * extra,  # past the single all-gather's room: a second round
    }
    loopback = LoopbackStrategy()
    expected = _collectives.gather_objects(loopback, state)
    assert len(expected) == 2
    strategy = RecordingStrategy(replies=loopback.replies)
    gathered = _collectives.gather_objects(strategy, state)
    assert strategy.devices == [torch.device("meta")] * (2 if extra else 1)
    for got in gathered:
        assert torch.equal(got["rng"]["torch"], state["rng"]["torch"])
        generator = got["draws"][0]["sampler"]["generator"]
        assert torch.equal(generator, state["draws"][0]["sampler"]["generator"])
        assert got["padding"] == state["padding"]


def test_gathered_tensors_come_back_equal_in_value_dtype_and_shape() -> None:
    tensors = [
        torch.arange(6, dtype=torch.int64).reshape(2, 3),
        torch.randn(3, 4).t(),  # not contiguous: torch's own pickling
        torch.ones(2, 2, dtype=torch.bfloat16),
        torch.tensor([True, False]),
        torch.zeros(0, 5),
        torch.tensor(3.5),  # no dimension
        torch.randn(2, requires_grad=True),
    ]
    shared = torch.arange(3)
    state = {"tensors": tensors, "twice": [shared, shared]}
    got = _collectives.gather_objects(LoopbackStrategy(), state)[1]
    for sent, back in zip(tensors, got["tensors"], strict=True):
        assert back.dtype == sent.dtype and back.shape == sent.shape
        assert torch.equal(back.detach(), sent.detach())
        assert back.requires_grad == sent.requires_grad
    assert got["twice"][0] is got["twice"][1]
    # A plain CPU tensor travels as its bytes, not through torch's own pickling (torch.save's format).
    assert b"_rebuild_tensor" not in _collectives._dumps({"rng": torch.get_rng_state()})
    assert b"_rebuild_tensor" in _collectives._dumps({"grad": tensors[-1]})  # with autograd: torch's
