"""``DurableCheckpointIO``: atomic, verified, asynchronous, mirrored checkpoint files."""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

import lightning
import torch
from lightning.fabric.plugins import CheckpointIO
from typing_extensions import override

from lightning_resume._checks import expand_dir, flag, is_number, whole_number
from lightning_resume._compat.torch import torch_records_supported
from lightning_resume._storage.atomic import exclusive, write_text_atomic
from lightning_resume._storage.catalog import Status, check_file, remedy, scan, verify
from lightning_resume._storage.commit import clean_stale, newest_first, remove
from lightning_resume._storage.kinds import FILE
from lightning_resume._storage.manifest import Entry, check_metadata, describe, manifest_path
from lightning_resume._storage.mirror import Mirroring
from lightning_resume._storage.store import LocalStore
from lightning_resume._version import __version__
from lightning_resume._warnings import warn
from lightning_resume.exceptions import CheckpointVerificationError
from lightning_resume.io.memory.memory_route import MemoryRoute
from lightning_resume.io.memory.memory_tier import MemoryTier
from lightning_resume.io.memory.node_memory import NodeMemory
from lightning_resume.io.restore import DURABLE, Restore
from lightning_resume.io.routes import Route, WriteBehind, WriteNow
from lightning_resume.io.settings import CheckpointSettings, Mirror
from lightning_resume.io.verified_load import load_verified
from lightning_resume.io.write_stats import WriteStats

log = logging.getLogger(__name__)

RESTORE_LOCK = ".lr-restore.lock"  #: held while downloading from the mirror: one process per node does
_MIRROR_COPY = "\0mirror"  # the mirror copy of the checkpoint being loaded, among the fallbacks
_FRACTION = "fraction within (0, 1]"


def manifest_versions() -> dict[str, str]:
    """The library versions a manifest records (files and directories alike)."""
    return {
        "lightning_resume": __version__,
        "lightning": str(lightning.__version__),
        "torch": str(torch.__version__),  # TorchVersion would make the writer import torch
        "python": platform.python_version(),
    }


def memory_tier_of(io: object) -> MemoryRoute | None:
    """The memory tier of a ``DurableCheckpointIO`` (its route and lifecycle); ``None`` without one."""
    return io._memory if isinstance(io, DurableCheckpointIO) else None


def copies_elsewhere(io: object, path: Path) -> tuple[str, str | None]:
    """At a restart without ``path``: the plugin's other tiers (``""``: none) and which holds a copy of it."""
    if not isinstance(io, DurableCheckpointIO):
        return "", None
    tiers, found = [], None
    if io._memory is not None:
        tiers.append("the nodes' memory tiers")
        found = io._memory.memory.holder(path)
    if (mirror := io.settings.mirror) is not None:
        tiers.append(f"the mirror {mirror.url!r}")
        if found is None and io._mirrors(path) and path.name in io._remote().committed(FILE):
            found = f"the mirror {mirror.url!r}"
    return " and ".join(tiers), found


class DurableCheckpointIO(CheckpointIO):
    """Checkpoint files that survive kills, full disks and lost nodes, written without stalling training.

    **Atomic** (a kill leaves the old file or the new one), **verified** (a manifest
    ``<file>.manifest.json`` with size, XXH3 hash, step, versions and your metadata; a file that does
    not verify falls back to the newest one that does, with a warning), **asynchronous** (the state is
    copied into shared memory; a writer process writes it at half speed until something waits for it),
    **mirrored** and **pruned**. One save is in flight at a time; its error is raised by the next call.
    :attr:`settings` apply to sharded saves too (``RequeueCheckpoint`` writes those).

    Args:
        asynchronous: Write in a background writer process (``False``: write before returning).
        dirpath: The local directory the mirror copies, restored from it on construction (variables
            expanded: ``"$TMPDIR/ckpt"``). Default: the folder of the first save (nothing restored).
        keep: Keep only the newest ``keep`` checkpoints per name pattern (``None``: delete only what
            Lightning's callbacks ask to delete).
        mirror: A copy of every checkpoint in ``dirpath`` on remote or shared storage: a
            :class:`~lightning_resume.Mirror`, or its URL alone (``"s3://bucket/run-42"``).
        metadata: User metadata stored in the manifest of every checkpoint (JSON values). Add per save
            with ``trainer.save_checkpoint(path, storage_options={"metadata": {...}})``.
        memory: A :class:`~lightning_resume.MemoryTier`: ``last.ckpt`` saved into node memory and
            copied to other nodes' memory, the checkpoint directory written every few saves (needs
            ``RequeueCheckpoint``).

    Raises:
        TypeError, ValueError: for an invalid option.
        ImportError: ``mirror`` is set and fsspec (or the backend for its protocol) is missing.

    Example::

        trainer = Trainer(
            plugins=[DurableCheckpointIO(mirror="s3://bucket/run-42", keep=3)],
            callbacks=[ModelCheckpoint(dirpath="ckpt", save_last=True)],
        )
        trainer.fit(model, ckpt_path="last")
    """

    #: Saves are atomic: ``RequeueCheckpoint`` lets this plugin write ``last.ckpt`` itself.
    writes_atomically = True

    def __init__(
        self,
        asynchronous: bool = True,
        dirpath: str | Path | None = None,
        keep: int | None = None,
        mirror: Mirror | str | None = None,
        metadata: dict[str, Any] | None = None,
        memory: MemoryTier | None = None,
    ) -> None:
        if memory is not None and not isinstance(memory, MemoryTier):
            raise TypeError(f"memory must be a MemoryTier or None, got {memory!r}.")
        if keep is not None:
            whole_number("keep", keep, minimum=1, what="whole number of checkpoints or None")
        self.settings = CheckpointSettings(
            asynchronous=flag("asynchronous", asynchronous),
            mirror=Mirror.of(mirror),
            dirpath=None if dirpath is None else expand_dir(dirpath, "DurableCheckpointIO(dirpath=...)"),
            keep=keep,
            metadata=dict(check_metadata(metadata or {})),
            memory=memory,
        )
        self._dirpath = self.settings.dirpath
        self._init_runtime()
        if mirror is not None:
            self._remote()  # fail now, with the install hint, rather than at the first save
            self.restore_from_mirror()  # nothing to restore without dirpath

    def _tune(self, direct_io: bool | None = None, background_share: float | None = None) -> None:
        """Set the tuning of :class:`CheckpointSettings` (not arguments) and choose the routes again."""
        if background_share is not None:
            if not is_number(background_share):
                raise TypeError(f"background_share must be a {_FRACTION}, got {background_share!r}.")
            if not 0 < background_share <= 1:  # NaN too
                raise ValueError(
                    f"background_share must be a {_FRACTION}, got {background_share!r}: e.g. 0.5 lets a "
                    "background write work half of the time, 1.0 writes at full speed."
                )
        direct = self.settings.direct_io if direct_io is None else flag("direct_io", direct_io)
        share = self.settings.background_share if background_share is None else background_share
        self.settings = dataclasses.replace(self.settings, direct_io=direct, background_share=float(share))
        self._choose_routes()

    def _init_runtime(self) -> None:
        self._lock = threading.RLock()
        self._mirror: Mirroring | None = None
        self._committed: dict[str, Entry] = {}
        self._prepared: set[Path] = set()
        self._warned: set[str] = set()
        self._urgent = False
        self._saving = False  # a save is on its route (a signal handler may interrupt it)
        self._last_write: WriteStats | None = None
        self._last_restore: Restore | None = None
        self._choose_routes()

    def _choose_routes(self) -> None:
        """The route of every save, chosen once, and the synchronous one the urgent path takes."""
        settings = self.settings
        self._now = WriteNow(settings.direct_io, settings.keep)
        route: Route = self._now
        if settings.asynchronous and os.name == "posix" and torch_records_supported():
            route = WriteBehind(settings.direct_io, settings.keep, settings.background_share)
        elif settings.asynchronous:
            self._warn_once(
                "async",
                "DurableCheckpointIO(asynchronous=True) needs a POSIX system and a torch whose serialiser it "
                f"knows (torch {torch.__version__}); saving synchronously instead.",
            )
        self._memory: MemoryRoute | None = None
        if settings.memory is not None:
            memory = NodeMemory(settings.memory, settings.direct_io, settings.keep)
            route = self._memory = MemoryRoute(memory, route, self._wrote, self._restored)
        self._route = route

    def __getstate__(self) -> dict[str, Any]:
        # Launchers that pickle the trainer (ddp_spawn) get the configuration, not threads and processes.
        return {"settings": self.settings, "_dirpath": self._dirpath}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        """Save ``checkpoint`` to ``path`` atomically; in the background when ``asynchronous``.

        Args:
            checkpoint: The state Lightning dumped.
            path: A local file path.
            storage_options: ``None`` or ``{"metadata": {...}}``, user metadata for this checkpoint's
                manifest (on top of the constructor's ``metadata``).

        Raises:
            OSError: the previous asynchronous save (or this one) failed; the file it replaces is intact.
            TypeError: for unsupported ``storage_options``.
            ValueError: ``path`` is a remote URL (use ``mirror=`` for remote copies).
        """
        fields = self._entry_fields(checkpoint, storage_options)
        target = self._local(path)
        if (folder := target.parent) not in self._prepared:
            folder.mkdir(parents=True, exist_ok=True)
            if removed := clean_stale(folder):
                log.info("removed %d leftover file(s) of interrupted saves in %s", len(removed), folder)
            self._prepared.add(folder)
        if self._urgent or self._saving:
            # The urgent path: a preemption's last save (after _hurry) or a save from a signal handler that
            # interrupted another, written after the one in flight, straight onto the durable tier.
            self._urgent = False
            self._route.wait()
            if self._memory is not None:
                self._memory.urgent()
            self._now.save(checkpoint, target, fields, lambda: self._known(target), self._on_commit)
            return
        self._saving = True
        try:
            self._route.save(checkpoint, target, fields, lambda: self._known(target), self._on_commit)
        finally:
            self._saving = False

    def _known(self, path: Path) -> Entry | None:
        with self._lock:
            return self._committed.get(str(path))

    def _on_commit(self, path: Path, entry: Entry, stats: WriteStats | None, pruned: list[str]) -> None:
        """Record a commit on the durable tier and queue it for the mirror."""
        if stats is not None:
            self._last_write = stats
        with self._lock:
            self._committed[str(path)] = entry
            for name in pruned:
                self._committed.pop(str(path.parent / name), None)
                log.debug("retention (keep=%s) removed %s", self.settings.keep, path.parent / name)
        if self._mirrors(path):
            self._remote().submit(FILE, path, lambda: self._committed.get(str(path)))

    def _wrote(self, stats: WriteStats) -> None:
        self._last_write = stats

    def _restored(self, record: Restore) -> None:
        """A sharded save assembled from the memory tier, which Lightning loads without this plugin."""
        self._last_restore = record
        log.info("%s", record.line())

    def _hurry(self) -> None:
        """The write in flight at full speed, the next save on the urgent path (``HurryingCheckpointIO``)."""
        self._urgent = True
        self._route.hurry()

    def wait_until_durable(self, mirrored: bool | None = None, timeout: float | None = None) -> None:
        """Block until the save in flight is committed (with a memory tier: until the newest save is on the
        durable tier too) and, when ``mirrored``, every upload is done.

        Args:
            mirrored: Wait for the uploads to the mirror too (default: the mirror's ``wait``).
            timeout: Seconds to wait for uploads (default: the mirror's ``timeout``).

        Raises:
            OSError, RuntimeError: the save (or the latest upload of a checkpoint) failed.
            TimeoutError: uploads still running after ``timeout`` seconds.
        """
        if self._memory is not None:
            self._memory.wait_until_durable()
        else:
            self._route.wait()
        mirror = self.settings.mirror
        wait = mirror is not None and (mirror.wait if mirrored is None else mirrored)
        if self._mirror is not None and mirror is not None and wait:
            self._mirror.wait(mirror.timeout if timeout is None else timeout)

    @property
    def busy(self) -> bool:
        """Whether a save is being written in the background, or uploads are queued or running."""
        return self._route.busy or (self._mirror is not None and self._mirror.pending > 0)

    @property
    def last_restore(self) -> Restore | None:
        """What the newest ``load_checkpoint`` read: tier, node, bytes and seconds; ``None`` before one."""
        return self._last_restore

    @property
    def last_write(self) -> WriteStats | None:
        """How the newest committed save was written (size, seconds to durable, duty cycle), or ``None``."""
        return self._last_write

    @property
    def _writer_pid(self) -> int | None:  # for tests
        route = self._memory.inner if self._memory is not None else self._route
        return route.writer_pid if isinstance(route, WriteBehind) else None

    @override
    def load_checkpoint(
        self, path: str | Path, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Load and verify ``path``; fall back to the newest checkpoint that verifies when it does not.

        Args:
            path: The checkpoint file (local; a remote URL is loaded as is, unverified).
            map_location: As for ``torch.load`` (default: tensors on the CPU, as Lightning's plugin).
            weights_only: As for ``torch.load``.

        Raises:
            FileNotFoundError: ``path`` does not exist (locally or on the mirror).
            CheckpointVerificationError: ``path`` does not verify and no other checkpoint does.
        """
        self._route.wait()
        location = map_location if map_location is not None else "cpu"
        if "://" in str(path) and not str(path).startswith("file://"):
            import fsspec

            with fsspec.open(str(path), "rb") as handle:
                return torch.load(handle, map_location=location, weights_only=weights_only)
        requested = self._local(path)
        target = Path(os.path.realpath(requested))
        started, wall = time.monotonic(), time.time()
        if self._memory is not None:
            # The durable copy's manifest and size only: its bytes are read only if it is loaded.
            durable = verify(target, FILE, checksums=False).manifest if target.is_file() else None
            restored = self._memory.memory.restore(target, durable, location, weights_only)
            if restored is not None:
                checkpoint, self._last_restore = restored
                log.info("%s", self._last_restore.line())
                return checkpoint
        checkpoint = self._load_durable(requested, target, location, weights_only)
        seconds = time.monotonic() - started
        step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
        size = target.stat().st_size if target.is_file() else 0
        self._last_restore = Restore(DURABLE, str(requested), size, seconds, step=step, started=wall)
        if self._memory is not None and self._memory.memory.attached:
            log.info("%s", self._last_restore.line())
        return checkpoint

    def _load_durable(
        self, requested: Path, target: Path, location: Any, weights_only: bool | None
    ) -> dict[str, Any]:
        if not target.exists() and self._mirrors(target):
            self._download(target, missing_only=True)
        loaded = load_verified(target, location, weights_only)
        if loaded.checkpoint is not None:
            return loaded.checkpoint
        if loaded.verdict.status is Status.MISSING:
            raise FileNotFoundError(f"Checkpoint file not found: {str(requested)!r}")
        for candidate, remote in self._fallbacks(target):
            if remote and self._download(target) is None:
                continue
            fallback = load_verified(candidate, location, weights_only)
            verified = fallback.verdict.manifest if fallback.verdict.status is Status.VERIFIED else None
            if fallback.checkpoint is not None and verified is not None:
                warn(
                    f"Checkpoint {str(requested)!r} is {loaded.reason}; loaded "
                    f"{'the mirror copy of it' if remote else repr(str(candidate))} "
                    f"({describe(verified)}) instead, the newest checkpoint that verifies."
                )
                return fallback.checkpoint
        mirror = self.settings.mirror
        where = f"{str(target.parent)!r}" + (f" or the mirror {mirror.url!r}" if mirror else "")
        fix = remedy(loaded.verdict.newer, "the checkpoint directory")
        raise CheckpointVerificationError(
            f"Checkpoint {str(requested)!r} is {loaded.reason}, and no other checkpoint in {where} verifies. "
            f"{fix}, or start without this checkpoint.",
            requested,
            loaded.reason,
        )

    def _fallbacks(self, target: Path) -> list[tuple[Path, bool]]:
        """Other committed checkpoints (local, and the mirror copy of ``target``), newest first."""
        candidates = {name: entry for name, entry in scan(target.parent).items() if name != target.name}
        remote = self._remote().committed(FILE).get(target.name) if self._mirrors(target) else None
        if remote is not None:
            candidates[_MIRROR_COPY] = remote
        return [
            (target, True) if name == _MIRROR_COPY else (target.parent / name, False)
            for name in newest_first(candidates)
        ]

    @override
    def remove_checkpoint(self, path: str | Path) -> None:
        """Delete ``path``, its manifest and mirror copy once the save in flight is committed (the only
        verified checkpoint of its directory is kept, with a warning).

        Raises:
            OSError, RuntimeError: the save in flight failed (the file to remove is then kept).
        """
        self._route.wait()
        target = self._local(path)
        with self._lock:
            if list(scan(target.parent)) == [target.name]:
                warn(
                    f"Not removing {str(target)!r}: it is the only verified checkpoint in "
                    f"{str(target.parent)!r}."
                )
                return
            remove(LocalStore(target.parent), FILE, target.name)
            self._committed.pop(str(target), None)
        if self._mirrors(target):
            self._remote().submit_delete(FILE, target.name)

    @override
    def teardown(self) -> None:
        """Wait for the save in flight and stop the writer; with the mirror's ``wait``, wait for uploads
        (a failure or the ``timeout`` is a warning); without it they go on in a daemon thread.

        Raises:
            OSError, RuntimeError: the save in flight failed.
        """
        try:
            self._route.finish()  # with a memory tier: then the newest save durable (its server stays up)
            self._now.finish()
        finally:
            settings = self.settings.mirror
            if self._mirror is not None and settings is not None and settings.wait:
                mirror, self._mirror = self._mirror, None
                mirror.close(settings.timeout)  # failures are warnings

    def _remote(self) -> Mirroring:
        if self._mirror is None:
            self._mirror = self.settings.open_mirror(self.settings.keep)
        return self._mirror

    def _mirrors(self, path: Path) -> bool:
        """Whether the mirror copies ``path``'s folder (without ``dirpath``: that of the first save)."""
        if self.settings.mirror is None:
            return False
        if self._dirpath is None:
            self._dirpath = path.parent
            log.info("DurableCheckpointIO mirrors %s to %s", self._dirpath, self.settings.mirror.url)
        if path.parent == self._dirpath:
            return True
        self._warn_once(
            f"mirror:{path.parent}",
            f"Checkpoints in {str(path.parent)!r} are not mirrored: DurableCheckpointIO(mirror="
            f"{self.settings.mirror.url!r}) copies {str(self._dirpath)!r} (set dirpath= to choose).",
        )
        return False

    def restore_from_mirror(self) -> list[Path]:
        """Download the mirror's checkpoints that ``dirpath`` lacks or holds older versions of.

        Done on construction, so that a job relaunched onto an empty (node-local) directory finds its
        checkpoints before ``fit`` looks. Downloads are verified; a file without a manifest is never replaced.

        Returns:
            What was downloaded.
        """
        if self.settings.mirror is None or self._dirpath is None:
            return []
        folder = self._dirpath
        folder.mkdir(parents=True, exist_ok=True)
        with exclusive(folder / RESTORE_LOCK):
            clean_stale(folder)
            return self._remote().restore_all(folder)

    def _download(self, target: Path, missing_only: bool = False) -> Path | None:
        """Download the mirror copy of ``target`` once per node (its processes take turns on a lock)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        with exclusive(target.parent / RESTORE_LOCK):
            if missing_only and target.exists():
                return None  # another process of this node restored it meanwhile
            return self._remote().restore(FILE, target.parent, target.name)

    def get_metadata(self, path: str | Path) -> dict[str, Any]:
        """The user metadata stored with the checkpoint at ``path``.

        Raises:
            ValueError: ``path`` has no manifest, or does not verify.
        """
        self._route.wait()
        return dict(self._verified_entry(self._local(path)).metadata)

    def set_metadata(self, path: str | Path, metadata: dict[str, Any]) -> None:
        """Replace the user metadata of the checkpoint at ``path`` (and of its mirror copy).

        Raises:
            TypeError: ``metadata`` is not JSON-serialisable.
            ValueError: ``path`` has no manifest, or does not verify.
        """
        self._rewrite(self._local(path), dict(check_metadata(metadata)))

    def update_metadata(self, path: str | Path, metadata: dict[str, Any]) -> None:
        """Add ``metadata`` to the user metadata of the checkpoint at ``path`` (and of its mirror copy).

        Raises:
            TypeError: ``metadata`` is not JSON-serialisable.
            ValueError: ``path`` has no manifest, or does not verify.
        """
        target = self._local(path)
        self._rewrite(target, {**self.get_metadata(target), **check_metadata(metadata)})

    def _verified_entry(self, path: Path) -> Entry:
        verdict = check_file(path)
        if verdict.status in (Status.NO_MANIFEST, Status.UNVERIFIABLE):
            raise ValueError(
                f"{str(path)!r} has no readable manifest ({path.name}.manifest.json): it was not saved by "
                "DurableCheckpointIO, so it has no metadata."
            )
        if verdict.status is not Status.VERIFIED or verdict.manifest is None:
            raise ValueError(f"{str(path)!r} does not verify against its manifest ({verdict.reason}).")
        return verdict.manifest

    def _rewrite(self, path: Path, metadata: dict[str, Any]) -> None:
        self._route.wait()  # before the lock: the commit it waits for takes the lock too
        with self._lock:
            updated = self._verified_entry(path).with_metadata(metadata)
            write_text_atomic(manifest_path(path), FILE.encode([updated]))
            self._committed[str(path)] = updated
        if self._mirrors(path):
            self._remote().submit(FILE, path, lambda: self._committed.get(str(path)))

    @staticmethod
    def _local(path: str | Path) -> Path:
        text = str(path)
        if text.startswith("file://"):
            text = text[len("file://") :]
        elif "://" in text:
            raise ValueError(
                f"DurableCheckpointIO writes checkpoints to a local filesystem, got {text!r}. Save to a "
                "local directory and set DurableCheckpointIO(mirror=...) for a remote copy."
            )
        return Path(text).expanduser().absolute()

    def _entry_fields(self, checkpoint: dict[str, Any], storage_options: Any | None) -> dict[str, Any]:
        """The manifest entry of a save but its size and checksum."""
        if storage_options is not None and (
            not isinstance(storage_options, dict) or set(storage_options) - {"metadata"}
        ):
            raise TypeError(
                "DurableCheckpointIO accepts storage_options=None or {'metadata': {...}} "
                f"(user metadata for the manifest), got {storage_options!r}."
            )
        extra = check_metadata((storage_options or {}).get("metadata") or {})
        step, epoch = checkpoint.get("global_step"), checkpoint.get("epoch")
        return {
            "global_step": int(step) if isinstance(step, int) else None,
            "epoch": int(epoch) if isinstance(epoch, int) else None,
            "saved_at": time.time(),
            "versions": manifest_versions(),
            "metadata": {**self.settings.metadata, **extra},
        }

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message)
