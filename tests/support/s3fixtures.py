"""S3 for the storage and checkpoint tests: moto's server, real HTTP on loopback.

Test modules import the fixtures by name (pytest puts tests/ on the path)::

    from support.s3fixtures import moto_endpoint, s3_uri
"""
from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
_buckets = itertools.count(1)


def s3_env(endpoint: str) -> dict[str, str]:
    """The standard AWS environment that points every client at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
    }


def s3_client(endpoint: str) -> object:
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(retries={"max_attempts": 2}))


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """One moto server for the run (``http://127.0.0.1:<port>``); each test
    gets buckets of its own (`s3_uri`), so none sees another's objects."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_uri(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket, with the AWS environment of this process pointing at moto:
    ``s3://<bucket>``. Subprocesses get the same through ``os.environ``."""
    for name, value in s3_env(moto_endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    bucket = f"ckpt-{os.getpid()}-{next(_buckets)}"
    s3_client(moto_endpoint).create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    return f"s3://{bucket}"
