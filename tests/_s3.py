"""A local S3 (moto's server on loopback) for mirror tests: endpoint, fresh buckets, fsspec options."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest


def moto_endpoint() -> Iterator[str]:
    """Run moto's S3 server on a free loopback port for as long as the generator lives."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def s3_options(endpoint: str) -> dict[str, Any]:
    """fsspec/s3fs options for ``endpoint``."""
    return {
        "key": "test",
        "secret": "test",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


def new_bucket(endpoint: str) -> str:
    """A new, empty bucket on ``endpoint``; returns its name."""
    import boto3

    bucket = f"b{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=bucket)
    return bucket
