"""What the callbacks and the sharded saver may ask of a ``CheckpointIO`` plugin: small protocols that
:class:`~lightning_resume.DurableCheckpointIO` implements and any plugin may, and :func:`settings_of`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lightning_resume._storage.mirror import Mirror
from lightning_resume._warnings import warn
from lightning_resume._writer.duty_cycle import WriteStats

#: Committed checkpoint directories kept without a ``keep`` setting: the current one and the fallback.
DIRECTORIES_KEPT = 2


@dataclass(frozen=True)
class CheckpointSettings:
    """How checkpoints are saved, for the saves the plugin writes and the sharded saves it never sees.

    The defaults are what applies without a :class:`~lightning_resume.DurableCheckpointIO`; see its
    arguments for each setting.
    """

    asynchronous: bool = False
    mirror: str | None = None
    mirror_options: Mapping[str, Any] = field(default_factory=dict)
    dirpath: Path | None = None
    keep: int | None = None
    wait_for_mirror: bool = True
    mirror_timeout: float = 1800.0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    direct_io: bool = True
    background_share: float = 0.5
    #: Deprecated tuning of the writer process, honoured for one more release.
    writer_start_timeout: float = 120.0
    writer_shutdown_timeout: float = 60.0
    writer_niceness: int = 0

    @property
    def directories_kept(self) -> int:
        """Committed checkpoint directories kept by sharded saves: ``keep``, else the current one and
        the fallback."""
        return self.keep if self.keep is not None else DIRECTORIES_KEPT

    def open_mirror(self, keep: int | None) -> Mirror:
        """The mirror these settings name, keeping ``keep`` copies per retention family."""
        assert self.mirror is not None
        options, report = dict(self.mirror_options), lambda message: warn(message, all_ranks=True)
        return Mirror(self.mirror, options, keep, self.direct_io, warn=report)


def settings_of(io: object) -> CheckpointSettings:
    """The ``settings`` of a checkpoint plugin (they apply to sharded saves too), or the defaults."""
    settings = getattr(io, "settings", None)
    return settings if isinstance(settings, CheckpointSettings) else CheckpointSettings()


@runtime_checkable
class AtomicCheckpointIO(Protocol):
    """A checkpoint plugin that writes every file atomically and can wait for its writes in flight.

    ``RequeueCheckpoint`` lets such a plugin write ``last.ckpt`` itself (instead of writing a
    temporary file and renaming it), and waits on :meth:`wait_until_durable` when a preemption needs
    ``last.ckpt`` on disk. :class:`~lightning_resume.DurableCheckpointIO` is one.
    """

    #: ``True``: a kill at any instant leaves the previous file or the new one at the target path.
    writes_atomically: bool

    def wait_until_durable(self) -> None:
        """Block until every write in flight is on disk; raise its error if it failed."""
        ...


@runtime_checkable
class ReportsWrites(Protocol):
    """Something that writes checkpoints and says when each one became durable: a new
    :attr:`last_write` object appears as a save is committed (the plugin's own, or the sharded saver's).
    ``RequeueCheckpoint`` times a save's time to durable from it."""

    @property
    def last_write(self) -> WriteStats | None:
        """How the newest committed save was written, or ``None`` before the first one."""
        ...


@runtime_checkable
class HurryingCheckpointIO(ReportsWrites, Protocol):
    """A checkpoint plugin that can make its next save durable sooner, and says how each write went.

    ``PreemptionHandler`` calls :meth:`hurry` before its last save (a wait for it follows at once) and
    reports :attr:`last_write` in its stop line. :class:`~lightning_resume.DurableCheckpointIO` is one.
    """

    def hurry(self) -> None:
        """Switch writes in flight to full speed and write the next save as soon as possible."""
        ...
