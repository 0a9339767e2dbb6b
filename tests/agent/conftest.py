"""The agent against moto server S3 on 127.0.0.1, as it would talk to S3 from a container."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest

from spotguard_cli.emulator.motoserver import MotoServer


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
