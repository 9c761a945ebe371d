"""``AzureNotice``: Azure's Scheduled Events (``Preempt``, ``Terminate``) for this virtual machine."""

from __future__ import annotations

import json
from dataclasses import dataclass

from lightning_resume._scheduler.machine import on_azure
from lightning_resume.preemption.notices._metadata_server_notice import MetadataServerNotice
from lightning_resume.preemption.notices._notice import Notice, parse_http_time

EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
STOPPING_EVENTS = ("Preempt", "Terminate")  # the event types that stop the machine


@dataclass(frozen=True)
class ScheduledStop:
    """One ``Preempt`` or ``Terminate`` event for this machine."""

    event_id: str
    event_type: str
    not_before: float | None  # ``None``: already started (Azure leaves ``NotBefore`` empty then)


def parse_scheduled_events(body: str, vm_name: str) -> list[ScheduledStop]:
    """The ``Preempt`` and ``Terminate`` events of ``vm_name`` (without case, as Azure's names compare) in a
    Scheduled Events answer, which lists other machines of the set too; ValueError for another document."""
    try:
        events = json.loads(body)["Events"]
        if not isinstance(events, list):
            raise TypeError("Events is not a list")
        stops = []
        for event in events:
            resources = [str(name).lower() for name in event.get("Resources") or []]
            if event["EventType"] not in STOPPING_EVENTS or vm_name.lower() not in resources:
                continue
            not_before = str(event.get("NotBefore") or "").strip()
            when = parse_http_time(not_before) if not_before else None
            stops.append(ScheduledStop(str(event.get("EventId", "")), event["EventType"], when))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"unexpected scheduled events answer {body[:200]!r}") from e
    return stops


class AzureNotice(MetadataServerNotice):
    """An Azure machine's ``Preempt`` (spot eviction, 30 seconds or more ahead) or ``Terminate`` event.

    Reads Scheduled Events (``/metadata/scheduledevents``, header ``Metadata: true``) and keeps the events
    whose ``Resources`` name this machine (``/metadata/instance/compute/name``, read once). The deadline
    is the event's ``NotBefore``; an event already started has none and is due when first seen. Applies
    on Azure machines (their chassis asset tag), or anywhere when ``endpoint`` is given. The first
    request can take a while on a new machine (Azure turns the service on then): the handler warns once
    if it times out, and polling goes on.

    Args:
        endpoint: The metadata server's base URL (default ``http://169.254.169.254``).
        interval: Seconds between two polls.
        timeout: Seconds to wait for one answer.

    Raises:
        TypeError: ``endpoint`` is not a string, or ``interval``/``timeout`` not a number.
        ValueError: an empty ``endpoint``, or a non-positive ``interval`` or ``timeout``.

    Example::

        PreemptionHandler(notices=Notices([AzureNotice()]))
    """

    name = "azure"
    _headers = {"Metadata": "true"}
    _on_this_cloud = staticmethod(on_azure)
    _vm_name: str | None = None  # read once

    def _poll(self, now: float) -> Notice | None:
        stops = parse_scheduled_events(self._get(EVENTS_PATH), self._machine_name())
        if not stops:
            return None

        def deadline(stop: ScheduledStop) -> float:  # a started event is due when first seen
            if stop.not_before is not None:
                return stop.not_before
            return self._first_seen.setdefault(stop.event_id, now)

        first = min(stops, key=deadline)
        when = deadline(first)
        return Notice(self.name, first.event_type, when, detail=f"event {first.event_id}", received=now)

    def _machine_name(self) -> str:
        if self._vm_name is None:
            name = self._get(NAME_PATH).strip()
            if not name or len(name) > 256 or any(c.isspace() for c in name):
                raise ValueError(f"unexpected compute/name answer {name[:200]!r}")
            self._vm_name = name
        return self._vm_name
