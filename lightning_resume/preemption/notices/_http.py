"""One HTTP request to a metadata server, with a time-out, never through a proxy. Standard library only."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping

#: More than any metadata answer a source reads; the rest is cut off.
MAX_BYTES = 1 << 16


def fetch(
    url: str, *, timeout: float, method: str = "GET", headers: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """``(HTTP status, body)`` of one request, never through a ``http_proxy`` (metadata servers are
    link-local); an error status is returned, no answer raises ``OSError``."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, method=method, headers=dict(headers or {}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, response.read(MAX_BYTES).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read(MAX_BYTES).decode("utf-8", "replace")


def endpoint_url(endpoint: str | None) -> str | None:
    """A source's ``endpoint`` argument without its trailing slash; TypeError or ValueError if not a URL."""
    if endpoint is None:
        return None
    message = f"endpoint must be a base URL such as 'http://127.0.0.1:8080', or None; got {endpoint!r}."
    if not isinstance(endpoint, str):
        raise TypeError(message)
    if not endpoint.strip():
        raise ValueError(message)
    return endpoint.strip().rstrip("/")
