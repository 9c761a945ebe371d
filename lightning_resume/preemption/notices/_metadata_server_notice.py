"""``MetadataServerNotice``: what the three cloud notices share (a metadata server, or an ``endpoint``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from lightning_resume._scheduler.machine import read_machine
from lightning_resume.preemption.notices._http import endpoint_url
from lightning_resume.preemption.notices._notice_source import NoticeSource

#: Where EC2, Compute Engine and Azure serve metadata (``metadata.google.internal`` by address: no DNS).
LINK_LOCAL_ENDPOINT = "http://169.254.169.254"


class MetadataServerNotice(NoticeSource):
    """A notice read from a cloud's instance metadata server: applies on that cloud's machines (told by
    :meth:`_on_this_cloud` from the firmware strings), or anywhere when ``endpoint`` points at a server."""

    #: The metadata server polled when no ``endpoint`` is given.
    default_endpoint: ClassVar[str] = LINK_LOCAL_ENDPOINT

    def __init__(self, endpoint: str | None = None, interval: float = 5.0, timeout: float = 1.0) -> None:
        super().__init__(interval=interval, timeout=timeout)
        self.endpoint = endpoint_url(endpoint)

    @property
    def base_url(self) -> str:
        """The metadata server polled."""
        return self.endpoint or self.default_endpoint

    def applies(self) -> bool:
        """On this cloud's machines, or anywhere with an ``endpoint``."""
        return self.endpoint is not None or self._on_this_cloud(read_machine())

    def _on_this_cloud(self, machine: Mapping[str, str]) -> bool:
        """Whether the firmware strings ``machine`` (``_machine.read_machine``) are this cloud's."""
        raise NotImplementedError(f"{type(self).__name__} must implement _on_this_cloud(machine)")

    def describe(self) -> str:
        return f"{self.name} at {self.base_url}"
