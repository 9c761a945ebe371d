"""``AwsSpotNotice``: EC2's spot interruption notice (two minutes ahead), read through IMDSv2."""

from __future__ import annotations

import json

from lightning_resume._scheduler.machine import on_aws
from lightning_resume.preemption.notices._metadata_server_notice import MetadataServerNotice
from lightning_resume.preemption.notices._notice import Notice, parse_iso_time

TOKEN_TTL = 21600  # seconds a session token lives (IMDSv2 allows up to six hours)


def parse_instance_action(body: str, received: float) -> Notice:
    """The notice in ``spot/instance-action``: ``{"action": "terminate", "time": "...Z"}``, or ValueError."""
    try:
        answer = json.loads(body)
        action, when = answer["action"], answer["time"]
        if not isinstance(action, str) or not isinstance(when, str):
            raise TypeError("action and time must be strings")
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"unexpected instance-action answer {body[:200]!r}") from e
    return Notice("aws-spot", action, parse_iso_time(when), detail=body.strip(), received=received)


class AwsSpotNotice(MetadataServerNotice):
    """An EC2 spot instance's interruption notice: ``terminate``, ``stop`` or ``hibernate`` two minutes ahead.

    Reads ``/latest/meta-data/spot/instance-action`` with an IMDSv2 session token (renewed before it
    expires); ``404`` means no interruption is scheduled. Applies on EC2 machines (their firmware
    strings), or anywhere when ``endpoint`` is given. In a container, IMDSv2 needs a hop limit of 2
    (``aws ec2 modify-instance-metadata-options --http-put-response-hop-limit 2``); with the default 1
    the token request gets no answer and the handler warns once.

    Args:
        endpoint: The metadata server's base URL (default ``http://169.254.169.254``), e.g. a local
            server that imitates it in a test.
        interval: Seconds between two polls (AWS recommends 5).
        timeout: Seconds to wait for one answer.

    Raises:
        TypeError: ``endpoint`` is not a string, or ``interval``/``timeout`` not a number.
        ValueError: an empty ``endpoint``, or a non-positive ``interval`` or ``timeout``.

    Example::

        PreemptionHandler(notices=Notices([AwsSpotNotice()]))
    """

    name = "aws-spot"
    _on_this_cloud = staticmethod(on_aws)
    _token: tuple[str, float] | None = None  # the session token and when to renew it

    def _poll(self, now: float) -> Notice | None:
        token = {"X-aws-ec2-metadata-token": self._session_token(now)}
        status, body = self._fetch("/latest/meta-data/spot/instance-action", headers=token)
        if status == 401:
            self._token = None  # expired or revoked: a new one at the next poll
        if status == 404:
            return None
        if status != 200:
            raise ValueError(f"instance-action answered HTTP {status}")
        return parse_instance_action(body, now)

    def _session_token(self, now: float) -> str:
        if self._token is None or now >= self._token[1]:
            ttl = {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)}
            status, body = self._fetch("/latest/api/token", method="PUT", headers=ttl)
            if status != 200 or not body.strip():
                raise ValueError(f"the IMDSv2 token request answered HTTP {status}")
            self._token = (body.strip(), now + TOKEN_TTL / 2)
        return self._token[0]
