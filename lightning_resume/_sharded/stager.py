"""A DCP stager that copies a state dict into host buffers allocated once and reused at every save."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.distributed.tensor import DTensor


class ReusedBufferStager:
    """DCP's ``AsyncStager`` protocol over buffers allocated at the first save and reused after.

    Lightning's sharded CPU state shares storage with the live parameters, so a background write needs
    a copy: each tensor goes into its own buffer (a ``memcpy``, not an allocation; a DTensor's local shard
    re-wrapped with the same mesh, placements, shape and stride), other values are deep-copied. Only for
    all-CPU states (:meth:`supports`): re-wrapping would move a GPU DTensor back to its device.
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
