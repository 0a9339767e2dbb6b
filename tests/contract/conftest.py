"""The two sides of the ledger's contract: the fakes (tests/fakes.py) and the DynamoDB adapters on moto in
this process. Only the ledger table is made, with the keys, attributes and index template.yaml declares
(no stack is deployed: a case takes milliseconds), a new one for each case.

A case takes `side` and uses `side.ledger`, `side.jobs` and `side.pools`, which share one table as the
adapters do in a function; `side.unreadable_job` and `side.unreadable_pool` plant an item that cannot be
read, as a newer code's write or a hand edit might leave one.

The other ports' modules take their `side` from moto_aws.py's `one_side`, whose boto3 clients a module
keeps in `moto_clients`."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import boto3
import pytest
from moto import mock_aws

from spotguard.adapters.clients import URGENT
from spotguard.adapters.dynamo import marshal
from spotguard.adapters.job_store import DynamoJobStore
from spotguard.adapters.ledger import DynamoLedger
from spotguard.adapters.pool_store import DynamoPoolStore
from spotguard.domain.jobs.model import JobState
from spotguard.domain.pools import pool_key
from spotguard_cli.emulator import template
from tests.fakes import Checkpoints, FakeJobStore, FakeLedger, FakePoolStore

REGION = "us-east-1"
_tables = itertools.count()


@dataclass
class Side:
    name: str
    ledger: Any  # DynamoLedger | FakeLedger
    jobs: Any  # DynamoJobStore | FakeJobStore
    pools: Any  # DynamoPoolStore | FakePoolStore
    client: Any = None  # the DynamoDB client (the adapters' side)
    table: str = ""

    def unreadable_job(self, job_id: str, state: JobState, updated_at: datetime) -> None:
        """A job item whose document no longer parses, still in the state index."""
        if self.client is None:
            self.jobs.unreadable[job_id] = (state, updated_at)
            return
        item = {
            "pk": f"JOB#{job_id}",
            "sk": "JOB",
            "doc": '{"job_id": "' + job_id + '", "state": "no-such-state"}',
            "rev": 0,
            "job_state": str(state),
            "updated_at": updated_at.isoformat(),
        }
        self.client.put_item(TableName=self.table, Item=marshal(item))

    def unreadable_pool(self, cluster: str, name: str) -> None:
        """A pool item whose document no longer parses."""
        if self.client is None:
            self.pools.unreadable.add((cluster, name))
            return
        item = {"pk": pool_key(cluster), "sk": name, "doc": "{}", "rev": 3, "gone": False}
        self.client.put_item(TableName=self.table, Item=marshal(item))


def ledger_table(client: Any) -> str:
    """A new table as template.yaml declares the ledger (keys, attributes, the ByState index)."""
    props = template.load()["Resources"]["LedgerTable"]["Properties"]
    name = f"spotguard-ledger-{next(_tables)}"
    client.create_table(
        TableName=name,
        AttributeDefinitions=props["AttributeDefinitions"],
        KeySchema=props["KeySchema"],
        GlobalSecondaryIndexes=props["GlobalSecondaryIndexes"],
        BillingMode=props["BillingMode"],
    )
    return name


@pytest.fixture(scope="module")
def dynamodb() -> Iterator[Any]:
    """moto in this process for a module's cases (each case gets a table of its own)."""
    with mock_aws():
        yield boto3.client("dynamodb", region_name=REGION, config=URGENT)


@pytest.fixture(scope="module")
def moto_clients() -> dict[str, Any]:
    """A module's boto3 clients by service, filled by moto_aws.py's `one_side` at its first moto case."""
    return {}


@pytest.fixture(params=["fake", "dynamodb"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    if request.param == "fake":
        shared: Checkpoints = {}
        yield Side("fake", FakeLedger(checkpoints=shared), FakeJobStore(checkpoints=shared), FakePoolStore())
        return
    client = request.getfixturevalue("dynamodb")
    table = ledger_table(client)
    yield Side(
        "dynamodb",
        DynamoLedger(client, table),
        DynamoJobStore(client, table),
        DynamoPoolStore(client, table),
        client=client,
        table=table,
    )
    client.delete_table(TableName=table)
