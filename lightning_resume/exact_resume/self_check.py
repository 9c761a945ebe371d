"""The resume that checks itself: a fingerprint (:func:`take`) of the first step after each save (in the
checkpoint, and in a file with what it produced); an exact resume's first step has no :func:`differences`."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from lightning_resume._storage.atomic import write_text_replacing
from lightning_resume.exact_resume import rng

Fingerprint = dict[str, Any]

#: How many elements of each tensor of a batch are hashed (evenly spaced, shape and type always).
SAMPLED = 4096
#: What a fingerprint saved at the save (not at the next step) may be compared on: unchanged between a
#: step's end and the next one's start unless a validation runs between them (a stop's save also holds
#: the batch the next step would have trained on).
AT_SAVE = ("position", "trainable", "modes", "optimizers", "grads", "rng", "batch")

_WHAT = {"batch": "the batch", "rng": "the random state"}  # the fields :func:`_described` names plainly
_REMEDY = {
    "batch": "the train data is not back at its batch: a loader without a state_dict that cannot be "
    "positioned (see the warning at train start), a dataset that draws from a generator of its own, or "
    "workers that draw other augmentation; give the loader a state_dict (torchdata's StatefulDataLoader) "
    "or make the dataset's draws depend on the sample index and epoch",
    "position": "the run does not continue where the checkpoint left it: a loader of unknown length (an "
    "IterableDataset) restarts its epoch (give it a state_dict, e.g. StatefulDataLoader, or save at epoch "
    "ends only), or a callback restored other training state after the checkpoint was loaded",
    "trainable": "a callback freezes or unfreezes parameters in a hook a resume does not run again (e.g. "
    "BaseFinetuning's setup or on_train_epoch_start); set requires_grad where it is restored, or save at "
    "epoch ends only",
    "modes": "a callback or hook sets a submodule's train/eval mode or a BatchNorm layer's "
    "track_running_stats in a hook a resume does not run again; set them where they are restored",
    "optimizers": "the optimizers' parameter groups or hyperparameters were changed outside their "
    "state_dict (a callback that adds a group or sets a learning rate in a hook a resume skips)",
    "grads": "gradients accumulated before the save are not held (a save inside an accumulation window)",
    "rng": "something draws random numbers between the restore and the step (another callback's "
    "on_train_start or on_train_batch_start) or a generator lightning_resume does not restore",
    "outcome": "every input of the step matched, but it computed something else: state outside every "
    "state_dict (an optimizer's or a scheduler's, a module attribute, a buffer registered with "
    "persistent=False) that the checkpoint does not hold or a resume changes; see exact_resume.md, "
    "'Known gaps'",
}


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=12)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    """Shape, type, :data:`SAMPLED` evenly spaced elements and each row's first (up to 16 times as many)."""
    tensor = tensor.detach()
    if hasattr(tensor, "to_local"):  # a DTensor: this rank's shard
        tensor = tensor.to_local()
    head = f"{tuple(tensor.shape)}{tensor.dtype}".encode()
    if not tensor.numel():
        return head
    flat = tensor.reshape(-1)
    spread = torch.linspace(
        0, flat.numel() - 1, min(SAMPLED, flat.numel()), dtype=torch.float64, device=flat.device
    )
    parts = [flat.index_select(0, spread.long())]
    if tensor.dim() > 1:
        parts.append(tensor.reshape(tensor.shape[0], -1)[: 16 * SAMPLED, 0])
    dense = (p.cpu().clone(memory_format=torch.contiguous_format) for p in parts)  # (a 1-element view
    return head + b"".join(p.view(torch.uint8).numpy().tobytes() for p in dense)  # keeps its stride)


def _leaves(value: Any, out: list[bytes], depth: int = 0) -> None:
    if depth > 8:
        out.append(b"...")
    elif isinstance(value, torch.Tensor):
        out.append(_tensor_bytes(value))
    elif isinstance(value, np.ndarray):
        out.append(_tensor_bytes(torch.from_numpy(np.ascontiguousarray(value))))
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            out.append(str(key).encode())
            _leaves(value[key], out, depth + 1)
    elif isinstance(value, (list, tuple)):
        out.append(f"[{len(value)}".encode())
        for item in value:
            _leaves(item, out, depth + 1)
    elif isinstance(value, (str, bytes, int, float, bool)) or value is None:
        out.append(repr(value).encode())
    elif isinstance(getattr(value, "__dict__", None), dict):  # a batch type of the user's: its fields
        _leaves(vars(value), out, depth + 1)
    else:
        out.append(type(value).__name__.encode())


def batch_digest(batch: Any) -> str:
    """The digest of a batch: its structure, and each tensor's shape, type and sampled elements."""
    parts: list[bytes] = []
    _leaves(batch, parts)
    return _digest(*parts)


def _rng_digest() -> str:
    state = rng.capture()
    py, npy = state["python"], state["numpy"]
    parts = [
        _tensor_bytes(py["state"]) + repr(py["gauss"]).encode(),
        _tensor_bytes(npy["keys"]) + repr((npy["pos"], npy["has_gauss"], npy["cached"])).encode(),
        state["torch"].numpy().tobytes(),
    ]
    parts += [s.numpy().tobytes() for s in state.get("cuda", [])]
    return _digest(*parts)


def untracked_norms(module: torch.nn.Module) -> list[str]:
    """The names of the norm layers whose ``track_running_stats`` is off (as ``BaseFinetuning`` freezes)."""
    return [n for n, m in module.named_modules() if getattr(m, "track_running_stats", True) is False]


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return type(value).__name__


def _optimizers(trainer: pl.Trainer) -> dict[str, Any]:
    """The learning rates (to show) and a digest of every group's size and hyperparameters."""
    groups = [group for optimizer in trainer.optimizers for group in optimizer.param_groups]
    described = [
        [len(g["params"]), sorted((k, _plain(v)) for k, v in g.items() if k != "params")] for g in groups
    ]
    digest = _digest(json.dumps(described, default=str).encode())
    return {"lrs": [_plain(g.get("lr")) for g in groups], "digest": digest}


def _holds_grads(module: torch.nn.Module) -> bool:
    """Whether a gradient is held that is not all zeros (``zero_grad(set_to_none=False)`` leaves zeros)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    local = (g.to_local() if hasattr(g, "to_local") else g for g in grads)  # a DTensor: this rank's shard
    return any(g.numel() and bool(g.detach().ne(0).any()) for g in local)


def take(trainer: pl.Trainer, batch_idx: int, uses_grads: bool, batch: Any = None) -> Fingerprint:
    """This rank's fingerprint of the step about to run; ``uses_grads``: it adds to the gradients held."""
    module = trainer.lightning_module
    trainable = [name for name, p in module.named_parameters() if p.requires_grad]
    off, untracked = [name for name, m in module.named_modules() if not m.training], untracked_norms(module)
    found: Fingerprint = {
        "position": [trainer.global_step, trainer.current_epoch, int(batch_idx)],
        # how many (shown when they differ) and a digest of their names
        "trainable": [len(trainable), len(list(module.parameters())), _digest("\n".join(trainable).encode())],
        "modes": [len(off), len(untracked), _digest("\n".join(off).encode(), "\n".join(untracked).encode())],
        "optimizers": _optimizers(trainer),
        "grads": [uses_grads, uses_grads and _holds_grads(module)],
        "rng": _rng_digest(),
    }
    if batch is not None:
        found["batch"] = batch_digest(batch)
    return found


def deterministic(module: torch.nn.Module) -> bool:
    """Whether a step of ``module`` computes the same bits again: on the CPU, or deterministic algorithms."""
    if torch.are_deterministic_algorithms_enabled():
        return True
    return all(p.device.type == "cpu" for p in itertools.islice(module.parameters(), 1))


def outcome(module: torch.nn.Module, loss: Any) -> dict[str, Any]:
    """What a step produced: a short digest of every parameter and buffer after it, and its loss."""
    tensors = itertools.chain(module.named_parameters(), module.named_buffers())
    digests = {name: _digest(_tensor_bytes(t))[:12] for name, t in tensors}  # (rows: an embedding's)
    if isinstance(loss, Mapping):
        loss = loss.get("loss")
    return {"loss": _plain(loss) if isinstance(loss, torch.Tensor) else None, "tensors": digests}


def _outcome_described(saved: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    a, b = saved.get("tensors") or {}, now.get("tensors") or {}
    differ = [name for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)]
    said = []
    if differ:
        names = ", ".join(differ[:3]) + (", ..." if len(differ) > 3 else "")
        said.append(f"{len(differ)} of {len(a)} parameters and buffers differ after it ({names})")
    if saved.get("loss") != now.get("loss"):
        said.append(f"its loss is {now.get('loss')}, was {saved.get('loss')}")
    return "every input matched, but the step computed something else: " + "; ".join(said or ["?"])


def _described(field: str, saved: Any, now: Any) -> str:
    if field == "position":
        return f"the position (step, epoch, batch) is {tuple(now)}, the interrupted run was at {tuple(saved)}"
    if field == "trainable":
        return f"{now[0]} of {now[1]} parameters are trainable, {saved[0]} were in the interrupted run"
    if field == "modes":
        return (
            f"{now[0]} submodules are in eval mode and {now[1]} norm layers track no running stats, "
            f"the interrupted run had {saved[0]} and {saved[1]}"
        )
    if field == "outcome":
        return _outcome_described(saved, now)
    if field == "optimizers":
        if saved.get("lrs") != now.get("lrs"):
            return f"the learning rates are {now.get('lrs')}, were {saved.get('lrs')}"
        return "the optimizers' parameter groups differ (sizes or hyperparameters)"
    if field == "grads":
        if saved[0] != now[0]:
            uses = "adds to the gradients held" if now[0] else "starts from zero gradients"
            return f"the step {uses}, the interrupted run's did not"
        return "accumulated gradients are " + ("held" if now[1] else "missing")
    return f"{_WHAT.get(field, field)} differs"


def differences(saved: Mapping[str, Any], now: Mapping[str, Any], fields: Sequence[str]) -> list[str]:
    """The ``fields`` (those in both fingerprints) whose values differ, each as ``"field: description"``."""
    return [
        f"{field}: {_described(field, saved[field], now[field])}"
        for field in fields
        if field in saved and field in now and saved[field] != now[field]
    ]


def position_lost(loaded_step: int, now_step: int) -> str:
    return (
        f"position: the restart trains from step {now_step}, but the checkpoint it loaded holds step "
        f"{loaded_step} (something restored other training state after it, e.g. a tuner callback)"
    )


def message(step: int, by_rank: Sequence[Sequence[str]]) -> str:
    """The one warning of an inexact resume: what differs on which ranks, and the remedies."""
    lines: dict[str, list[int]] = {}
    for rank, found in enumerate(by_rank):
        for line in found:
            lines.setdefault(line, []).append(rank)
    world = len(by_rank)
    described = [
        line + ("" if world == 1 else f" (rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))})")
        for line, ranks in lines.items()
    ]
    fields = dict.fromkeys(line.split(":", 1)[0] for line in lines)
    remedies = "; ".join(f"{field}: {_REMEDY[field]}" for field in fields)
    return (
        f"Resume self-check: the first step resumed after step {step} differs from the interrupted run's: "
        + "; ".join(described)
        + ". Training goes on, but it will not end with an uninterrupted run's weights. What to do: "
        + remedies
        + ". (docs: exact_resume.md, 'The self-check')"
    )


def verdict(by_rank: Sequence[Sequence[str]], fields: Sequence[str]) -> str:
    """What ``attempts.json`` records: ``exact (checked: ...)`` or ``differs: ...``."""
    found = sorted({line.split(":", 1)[0] for lines in by_rank for line in lines})
    if found:
        return "differs: " + ", ".join(found)
    return "exact (checked: " + ", ".join(sorted(fields)) + ")"


# -- the uninterrupted run's first step after a save ------------------------------------------------


def next_path(folder: Path, rank: int, saved_step: int) -> Path:
    return folder / f"rank-{rank}.step-{saved_step}.json"


def write_next(folder: Path, rank: int, saved_at: list[int], fingerprint: Fingerprint) -> None:
    """Record this rank's fingerprint of the first step after the save at ``saved_at``; drop older ones."""
    # No fsync (an ext4 rename over a file flushes it): lost, the check falls back to the checkpoint's own.
    folder.mkdir(parents=True, exist_ok=True)
    path = next_path(folder, rank, saved_at[0])
    write_text_replacing(path, json.dumps({"saved_at": saved_at, "fingerprint": fingerprint}))
    for older in folder.glob(f"rank-{rank}.step-*.json"):
        if older != path:
            older.unlink(missing_ok=True)


def read_next(folder: Path, rank: int, saved_at: list[int]) -> Fingerprint | None:
    """What :func:`write_next` recorded after the save at ``saved_at`` (``None``: nothing)."""
    try:
        data = json.loads(next_path(folder, rank, saved_at[0]).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("saved_at") != saved_at:
        return None
    fingerprint = data.get("fingerprint")
    return fingerprint if isinstance(fingerprint, dict) else None
