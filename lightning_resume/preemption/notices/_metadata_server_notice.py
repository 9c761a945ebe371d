"""``MetadataServerNotice``: what the three cloud notices share: a metadata server (or an ``endpoint``),
asked with a time-out and never through a proxy. Standard library only."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import ClassVar

from lightning_resume._scheduler.machine import read_machine
from lightning_resume.preemption.notices._notice_source import NoticeSource

#: Where EC2, Compute Engine and Azure serve metadata (``metadata.google.internal`` by address: no DNS).
LINK_LOCAL_ENDPOINT = "http://169.254.169.254"
#: More than any metadata answer a source reads; the rest is cut off.
MAX_BYTES = 1 << 16


class MetadataServerNotice(NoticeSource):
    """A notice read from a cloud's instance metadata server: applies on that cloud's machines (told by
    :meth:`_on_this_cloud` from the firmware strings), or anywhere when ``endpoint`` points at a server."""

    #: Headers sent with every request to this cloud's server.
    _headers: ClassVar[Mapping[str, str]] = {}

    def __init__(self, endpoint: str | None = None, interval: float = 5.0, timeout: float = 1.0) -> None:
        super().__init__(interval=interval, timeout=timeout)
        if endpoint is not None:
            message = (
                f"endpoint must be a base URL such as 'http://127.0.0.1:8080', or None; got {endpoint!r}."
            )
            if not isinstance(endpoint, str):
                raise TypeError(message)
            if not endpoint.strip():
                raise ValueError(message)
            endpoint = endpoint.strip().rstrip("/")
        self.endpoint = endpoint
        self._first_seen: dict[str, float] = {}  # when a notice without its own deadline was first seen

    @property
    def base_url(self) -> str:
        """The metadata server polled."""
        return self.endpoint or LINK_LOCAL_ENDPOINT

    def applies(self) -> bool:
        """On this cloud's machines, or anywhere with an ``endpoint``."""
        return self.endpoint is not None or self._on_this_cloud(read_machine())

    def _on_this_cloud(self, machine: Mapping[str, str]) -> bool:
        """Whether the firmware strings ``machine`` (``read_machine()``) are this cloud's."""
        raise NotImplementedError(f"{type(self).__name__} must implement _on_this_cloud(machine)")

    def describe(self) -> str:
        return f"{self.name} at {self.base_url}"

    def _fetch(
        self, path: str, method: str = "GET", headers: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        """``(HTTP status, body)`` of one request; an error status is returned, no answer raises OSError."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # link-local: no http_proxy
        request = urllib.request.Request(
            self.base_url + path, method=method, headers={**self._headers, **(headers or {})}
        )
        try:
            with opener.open(request, timeout=self.timeout) as response:
                return response.status, response.read(MAX_BYTES).decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            with e:
                return e.code, e.read(MAX_BYTES).decode("utf-8", "replace")

    def _get(self, path: str, what: str | None = None) -> str:
        """The body of ``path``; ValueError naming ``what`` (default: the path) for any status but 200."""
        status, body = self._fetch(path)
        if status != 200:
            raise ValueError(f"{what or path.split('?')[0]} answered HTTP {status}")
        return body
