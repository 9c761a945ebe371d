"""A launcher's saved configuration in the run dir, compared across attempts: pure functions."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

#: Top-level keys a restart may change without changing the run: ``RequeueCheckpoint`` resumes from
#: ``last.ckpt`` whatever ``ckpt_path`` says (it applies to a run's first attempt only).
IGNORED = frozenset({"ckpt_path"})
ABSENT = "<absent>"  # shown for a key that one side does not have

Change = tuple[str, Any, Any]


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"trainer.max_steps": 5, "trainer.callbacks[0].class_path": ...}`` (an empty dict/list: a value)."""
    if isinstance(data, Mapping) and data:
        items = [(f"{prefix}.{key}" if prefix else str(key), value) for key, value in data.items()]
    elif isinstance(data, list) and data:
        items = [(f"{prefix}[{i}]", value) for i, value in enumerate(data)]
    else:
        return {prefix: data}
    return {key: leaf for path, value in items for key, leaf in flatten(value, path).items()}


def changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    """``(key, before, now)`` for every differing leaf, sorted; top-level :data:`IGNORED` keys skipped."""

    def kept(data: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in flatten(dict(data)).items() if k.split(".")[0].split("[")[0] not in IGNORED}

    old, new = kept(before), kept(now)
    return [
        (key, old.get(key, ABSENT), new.get(key, ABSENT))
        for key in sorted(old.keys() | new.keys())
        if old.get(key, ABSENT) != new.get(key, ABSENT)
    ]


def describe(found: list[Change], limit: int = 12) -> str:
    """``model.lr: 0.01 -> 0.02, trainer.max_steps: 30 -> 40`` (at most ``limit`` keys, then a count)."""
    shown = ", ".join(f"{key}: {then!r} -> {now!r}" for key, then, now in found[:limit])
    return shown + (f", ... ({len(found) - limit} more)" if len(found) > limit else "")


def read_config(path: Path) -> dict[str, Any] | None:
    """The YAML mapping saved in ``path``; ``None`` when there is none (``ValueError``: unusable)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {str(path)!r}: {e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{str(path)!r} is not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} does not hold a YAML mapping")
    return data


def kept_name(path: Path) -> Path:
    """The first free ``config.1.yaml``, ``config.2.yaml``, ... beside ``path``: where to keep an old one."""
    n = 1
    while (kept := path.with_name(f"{path.stem}.{n}{path.suffix}")).exists():
        n += 1
    return kept
