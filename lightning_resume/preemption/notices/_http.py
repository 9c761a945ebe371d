"""One HTTP request to a metadata server, with a time-out, never through a proxy. Standard library only."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping

#: More than any metadata answer a notice source reads; a server that sends more is cut off here.
MAX_BYTES = 1 << 16


def fetch(
    url: str, *, timeout: float, method: str = "GET", headers: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """``(HTTP status, body)`` of one request; an error status is returned, not raised.

    Metadata servers are link-local: a ``http_proxy`` set for the job must not be used for them.

    Raises:
        OSError: no answer (connection refused, time-out, DNS failure): ``urllib.error.URLError``,
            ``TimeoutError``.
    """
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, method=method, headers=dict(headers or {}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, response.read(MAX_BYTES).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read(MAX_BYTES).decode("utf-8", "replace")


def endpoint_url(endpoint: str | None) -> str | None:
    """A source's ``endpoint`` argument: a base URL without its trailing slash, or ``None``.

    Raises:
        TypeError: not a string.
        ValueError: an empty string.
    """
    if endpoint is None:
        return None
    if not isinstance(endpoint, str):
        raise TypeError(
            f"endpoint must be a base URL such as 'http://127.0.0.1:8080', or None; got {endpoint!r}."
        )
    if not endpoint.strip():
        raise ValueError(
            f"endpoint must be a base URL such as 'http://127.0.0.1:8080', or None; got {endpoint!r}."
        )
    return endpoint.strip().rstrip("/")
