"""``GceNotice``: Compute Engine's preemption flag and host-maintenance event, from its metadata server."""

from __future__ import annotations

import re

from lightning_resume._scheduler.machine import on_gce
from lightning_resume.preemption.notices._metadata_server_notice import MetadataServerNotice
from lightning_resume.preemption.notices._notice import Notice

PREEMPTION_SECONDS = 30.0  # from the preemption (or spot stop) notice to the forced stop
MAINTENANCE_SECONDS = 60.0  # from a terminating host-maintenance notice to the stop


def parse_preempted(body: str) -> bool:
    """``instance/preempted``: ``TRUE`` or ``FALSE``; ValueError for anything else."""
    value = body.strip().upper()
    if value not in ("TRUE", "FALSE"):
        raise ValueError(f"unexpected instance/preempted answer {body[:200]!r}")
    return value == "TRUE"


def parse_maintenance_event(body: str) -> str | None:
    """``instance/maintenance-event``: the event if it stops the machine (``TERMINATE_ON_HOST_MAINTENANCE``),
    else ``None`` (``NONE``, or a live migration); ValueError for no event name."""
    value = body.strip()
    if not re.fullmatch(r"[A-Z_]+", value):
        raise ValueError(f"unexpected instance/maintenance-event answer {body[:200]!r}")
    return value if "TERMINATE" in value else None


class GceNotice(MetadataServerNotice):
    """A Compute Engine machine's preemption (spot or preemptible) or terminating host maintenance.

    Reads ``instance/preempted`` (``TRUE`` about 30 seconds before a preemption stop) and
    ``instance/maintenance-event`` (``TERMINATE_ON_HOST_MAINTENANCE`` about 60 seconds before a
    maintenance stop; a live migration is no notice). The deadline counts from when the notice was
    first seen. Applies on Compute Engine machines (firmware strings), or anywhere with ``endpoint``.

    Args:
        endpoint: The metadata server's base URL (default ``http://169.254.169.254``, the address of
            ``metadata.google.internal``).
        interval: Seconds between two polls.
        timeout: Seconds to wait for one answer.

    Raises:
        TypeError: ``endpoint`` is not a string, or ``interval``/``timeout`` not a number.
        ValueError: an empty ``endpoint``, or a non-positive ``interval`` or ``timeout``.

    Example::

        PreemptionHandler(notices=Notices([GceNotice()]))
    """

    name = "gce"
    _headers = {"Metadata-Flavor": "Google"}
    _on_this_cloud = staticmethod(on_gce)

    def _poll(self, now: float) -> Notice | None:
        if parse_preempted(self._instance("preempted")):
            return self._notice("preempted", PREEMPTION_SECONDS, now)
        event = parse_maintenance_event(self._instance("maintenance-event"))
        return self._notice(event, MAINTENANCE_SECONDS, now) if event is not None else None

    def _instance(self, key: str) -> str:
        return self._get(f"/computeMetadata/v1/instance/{key}", f"instance/{key}")

    def _notice(self, kind: str, seconds: float, now: float) -> Notice:
        first = self._first_seen.setdefault(kind, now)
        return Notice(self.name, kind, first + seconds, detail=f"{kind} seen at {first:.3f}", received=first)
