"""How checkpoints are written: :class:`Mirror` and :class:`CheckpointSettings`, read by sharded saves too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_resume._checks import flag, positive_number
from lightning_resume._storage.mirror import Mirroring
from lightning_resume._warnings import warn
from lightning_resume.io.memory.memory_tier import MemoryTier

DIRECTORIES_KEPT = 2  #: without ``keep``: the current checkpoint directory and the fallback


@dataclass(frozen=True)
class Mirror:
    """A copy of every checkpoint on remote or shared storage (``DurableCheckpointIO(mirror=...)``).

    Uploaded in the background, restored onto empty disks. Remote URLs need
    ``pip install "lightning-resume[remote]"``.

    Args:
        url: An fsspec URL: ``s3://bucket/run-42``, ``gs://...``, ``file:///shared/run-42``.
        options: Keyword arguments for the fsspec filesystem of ``url`` (e.g. ``{"anon": False}``).
        wait: ``teardown`` and ``wait_until_durable`` wait for uploads in flight, so that a preempted job
            exits with its newest checkpoint on the mirror.
        timeout: Seconds to wait for uploads there.

    Raises:
        TypeError, ValueError: for an invalid setting.

    Example::

        DurableCheckpointIO(mirror=Mirror("s3://bucket/run-42", options={"anon": False}), keep=3)
        DurableCheckpointIO(mirror="s3://bucket/run-42")  # a URL alone: the defaults
    """

    url: str
    options: Mapping[str, Any] = field(default_factory=dict)
    wait: bool = True
    timeout: float = 1800.0

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.strip():
            raise ValueError(f"Mirror url must be an fsspec URL, got {self.url!r}.")
        if not isinstance(self.options, Mapping):
            raise TypeError(f"Mirror options must be a mapping of fsspec options, got {self.options!r}.")
        flag("Mirror wait", self.wait)
        positive_number("Mirror timeout", self.timeout, what="number of seconds")
        object.__setattr__(self, "options", dict(self.options))
        object.__setattr__(self, "timeout", float(self.timeout))

    @classmethod
    def of(cls, value: Mirror | str | None) -> Mirror | None:
        """``value`` as a :class:`Mirror` (a URL alone gets the defaults).

        Raises:
            TypeError, ValueError: neither a ``Mirror``, a valid URL nor ``None``.
        """
        if value is None or isinstance(value, Mirror):
            return value
        if isinstance(value, str):
            return cls(value)
        raise TypeError(f"mirror must be a Mirror, an fsspec URL or None, got {value!r}.")


@dataclass(frozen=True)
class CheckpointSettings:
    """How checkpoints are saved, by the plugin and by the sharded saves it never sees.

    The defaults apply without a :class:`~lightning_resume.DurableCheckpointIO`; its arguments describe
    each setting. ``direct_io`` (write past the page cache where allowed) and ``background_share`` (of the
    time a background write may spend writing, in (0, 1]) are tuning, not arguments."""

    asynchronous: bool = False
    mirror: Mirror | None = None
    dirpath: Path | None = None
    keep: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    memory: MemoryTier | None = None
    direct_io: bool = True
    background_share: float = 0.5

    @property
    def directories_kept(self) -> int:
        """Checkpoint directories sharded saves keep: ``keep``, else the current one and the fallback."""
        return self.keep if self.keep is not None else DIRECTORIES_KEPT

    def open_mirror(self, keep: int | None) -> Mirroring:
        """The uploads to the mirror these settings name, keeping ``keep`` copies per retention family."""
        assert self.mirror is not None
        report = lambda message: warn(message, all_ranks=True)  # noqa: E731
        return Mirroring(self.mirror.url, dict(self.mirror.options), keep, self.direct_io, warn=report)


def settings_of(io: object) -> CheckpointSettings:
    """The ``settings`` of a checkpoint plugin (they apply to sharded saves too), or the defaults."""
    settings = getattr(io, "settings", None)
    return settings if isinstance(settings, CheckpointSettings) else CheckpointSettings()
