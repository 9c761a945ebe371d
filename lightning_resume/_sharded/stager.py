"""A DCP stager that copies a state dict into host buffers allocated once and reused at every save."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.distributed.tensor import DTensor


class ReusedBufferStager:
    """DCP's ``AsyncStager`` protocol over buffers allocated at the first save and reused after.

    Lightning's sharded state dicts hold CPU tensors that share storage with the live parameters and
    optimizer state (``cpu_offload=True`` of a CPU model aliases them), so a write in the background
    must work on a copy. Each tensor is copied into its own buffer (a DTensor's local shard, re-wrapped
    with the same mesh, placements, shape and stride, so DCP plans and writes what it would have written
    from the live state); other values are deep-copied. A copy into an existing buffer costs a
    ``memcpy``, not an allocation.

    Only for states whose tensors all live on the CPU (:meth:`supports`): a DTensor on a GPU mesh would
    be moved back to its device when re-wrapped. DCP's ``DefaultStager`` handles those.
    """

    # DCP reads this: staging is finished when ``stage`` returns.
    _synchronize_after_execute = False

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    @staticmethod
    def supports(state: Any) -> bool:
        """Whether every tensor of ``state`` (nested dicts and lists) lives on the CPU."""
        if isinstance(state, DTensor):
            return state.device_mesh.device_type == "cpu" and state.to_local().device.type == "cpu"
        if isinstance(state, torch.Tensor):
            return type(state) is torch.Tensor and state.device.type == "cpu"
        if isinstance(state, dict):
            return all(ReusedBufferStager.supports(v) for v in state.values())
        if isinstance(state, (list, tuple)):
            return all(ReusedBufferStager.supports(v) for v in state)
        return True

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state_dict`` that later training steps do not change."""
        staged: dict[str, Any] = self._stage(state_dict, ())
        return staged

    def _buffer(self, key: tuple[Any, ...], like: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != like.shape or buffer.dtype != like.dtype:
            buffer = torch.empty(like.shape, dtype=like.dtype, device="cpu")
            self._buffers[key] = buffer
        return buffer

    def _stage(self, state: Any, key: tuple[Any, ...]) -> Any:
        if isinstance(state, DTensor):
            local = state.to_local()
            buffer = self._buffer(key, local)
            buffer.copy_(local)
            return DTensor.from_local(
                buffer,
                state.device_mesh,
                state.placements,
                run_check=False,
                shape=state.shape,
                stride=state.stride(),
            )
        if isinstance(state, torch.Tensor):
            buffer = self._buffer(key, state)
            buffer.copy_(state)
            return buffer
        if isinstance(state, dict):
            return {k: self._stage(v, (*key, k)) for k, v in state.items()}
        if isinstance(state, (list, tuple)):
            return type(state)(self._stage(v, (*key, i)) for i, v in enumerate(state))
        return copy.deepcopy(state)

    def synchronize_staging(self) -> None:
        """Nothing to wait for: :meth:`stage` copies before it returns."""

    def close(self) -> None:
        self._buffers.clear()
