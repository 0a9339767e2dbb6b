"""The agent against moto server S3 on 127.0.0.1, as it would talk to S3 from a container."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest
from botocore.retries.standard import ExponentialBackoff

from spotguard_cli.emulator.motoserver import MotoServer
from tests.agent.s3faults import S3Faults, faulty_client


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture
def s3(moto_server):
    return boto3.client("s3", endpoint_url=moto_server.endpoint, region_name="us-east-1")


@pytest.fixture
def bucket(s3) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def faults(moto_server, monkeypatch) -> S3Faults:
    """A client with botocore's standard retry mode whose requests can be made to fail; botocore's
    backoff between its retries is zero here, so that a test with many injected errors stays fast."""
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.0)
    return S3Faults(faulty_client(moto_server.endpoint))
