"""``saves.json`` (beside the checkpoint folder, which may be lost): whether the run has committed a
checkpoint (the restart rule) and what its checkpoints pickle (:mod:`.own_hparams`). Written by rank 0."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lightning_resume._storage.atomic import write_json_atomic
from lightning_resume.run_dir import layout


@dataclass(frozen=True)
class SaveRecord:
    """The run's record of its saves: ``committed`` once a checkpoint was; the kinds they ``pickled``."""

    committed: bool = False
    pickled: frozenset[str] = frozenset()


def read(run_dir: Path) -> SaveRecord:
    """The record; an unreadable one counts as committed (a restart raises rather than start over)."""
    try:
        data = json.loads(layout.saves_record(run_dir).read_text())
    except FileNotFoundError:
        return SaveRecord()
    except (OSError, ValueError):
        return SaveRecord(committed=True)
    if not isinstance(data, dict):
        return SaveRecord(committed=True)
    kinds = data.get("pickled")
    return SaveRecord(bool(data.get("committed")), frozenset(k for k in kinds or () if isinstance(k, str)))


def update(run_dir: Path, committed: bool = False, pickled: Iterable[str] = ()) -> SaveRecord:
    """Add to the record (``committed`` stays once set; kinds are only added); written when it changed."""
    before = read(run_dir)
    after = SaveRecord(before.committed or committed, before.pickled | frozenset(pickled))
    if after != before:
        write_json_atomic(
            layout.saves_record(run_dir), {"committed": after.committed, "pickled": sorted(after.pickled)}
        )
    return after
