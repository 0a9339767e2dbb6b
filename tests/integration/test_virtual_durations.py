"""What an invocation takes on the virtual clock (emulator/latency.py): each AWS call its modelled latency,
a cold start its init duration; and moto's DynamoDB scans made quicker without changing their order
(emulator/motopatch.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import boto3
from moto import mock_aws

from spotguard_cli.emulator.latency import ColdStarts, Latency, LatencyModel
from spotguard_cli.emulator.motopatch import quicker_dynamodb_scans
from spotguard_cli.emulator.vclock import VirtualClock

START = datetime(2030, 1, 7, tzinfo=UTC)


def test_a_call_takes_its_latency_on_the_virtual_clock_and_no_wall_time():
    clock = VirtualClock(START)
    on = {"now": True}
    model = LatencyModel(
        by_service={"dynamodb": Latency(300, 301)},
        sleep=clock.advance,
        applies=lambda: on["now"],
        keep_served=False,
    )
    began = time.monotonic()
    for _ in range(10):
        model._before_send(None, event_name="before-send.dynamodb.PutItem")
    assert time.monotonic() - began < 0.5  # ten calls of ~0.3 s each: none slept
    moved = (clock.now() - START).total_seconds()
    assert 2.9 < moved < 3.1 and abs(moved - model.slept_seconds) < 1e-5  # timedelta keeps microseconds
    on["now"] = False  # a call the model leaves out (the soak's own questions) takes no time
    model._before_send(None, event_name="before-send.dynamodb.PutItem")
    assert (clock.now() - START).total_seconds() == moved
    model._response_received({})
    assert model.served == []


def test_a_cold_start_at_the_first_invocation_and_after_the_environment_sat_idle():
    clock = VirtualClock(START)
    cold = ColdStarts(clock.now, clock.advance, init=Latency(1000, 1001), idle_seconds=600)
    seen: list[datetime] = []

    def handler(event: Any, context: Any) -> str:
        seen.append(clock.now())
        return "done"

    host = SimpleNamespace(handler=handler)
    cold.wrap(host)  # type: ignore[arg-type]
    assert host.handler({}, None) == "done"
    assert cold.starts == 1 and timedelta(seconds=0.99) < seen[0] - START < timedelta(seconds=1.01)
    clock.advance(300)  # warm: within the idle time
    host.handler({}, None)
    assert cold.starts == 1 and seen[1] == clock.now()
    clock.advance(601)  # recycled
    host.handler({}, None)
    assert cold.starts == 2 and abs(cold.init_seconds - 2.0) < 0.01


def _table(ddb: Any) -> None:
    ddb.create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "state", "AttributeType": "S"},
            {"AttributeName": "n", "AttributeType": "N"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-state",
                "KeySchema": [
                    {"AttributeName": "state", "KeyType": "HASH"},
                    {"AttributeName": "n", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    for i in range(60):
        ddb.put_item(
            TableName="t",
            Item={
                "pk": {"S": f"JOB#{i % 7}"},
                "sk": {"S": f"A#{(i * 37) % 60:03d}"},
                "state": {"S": "running" if i % 3 else "queued"},
                "n": {"N": str((i * 13) % 17 - 8)},
            },
        )


def _answers(ddb: Any) -> list[Any]:
    return [
        ddb.query(
            TableName="t", KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "JOB#3"}}
        )["Items"],
        # newest first, a range condition, pages of 3 followed to the end, an unknown hash key
        [
            item
            for page in ddb.get_paginator("query").paginate(
                TableName="t",
                KeyConditionExpression="pk = :p AND sk >= :s",
                ExpressionAttributeValues={":p": {"S": "JOB#5"}, ":s": {"S": "A#010"}},
                ScanIndexForward=False,
                PaginationConfig={"PageSize": 3},
            )
            for item in page["Items"]
        ],
        ddb.query(
            TableName="t", KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "NONE"}}
        )["Items"],
        ddb.query(
            TableName="t",
            IndexName="by-state",
            KeyConditionExpression="#s = :s",
            ExpressionAttributeNames={"#s": "state"},
            ExpressionAttributeValues={":s": {"S": "running"}},
        )["Items"],
        ddb.scan(TableName="t")["Items"],
    ]


def test_quicker_scans_answer_in_moto_s_own_order():
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        _table(ddb)
        moto_own = _answers(ddb)
        with quicker_dynamodb_scans():
            quicker = _answers(ddb)
        assert quicker == moto_own and len(quicker[4]) == 60 and len(quicker[1]) > 3
        assert _answers(ddb) == moto_own  # put back on the way out


def test_quicker_dispatch_answers_as_moto_does_and_is_put_back():
    import moto.core.responses as responses
    import moto.sqs.models as sqs_models
    from moto.core import utils

    from spotguard_cli.emulator.motopatch import quicker_dispatch

    real_snake, real_names = utils.camelcase_to_underscores, utils.method_names_from_class
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q", Attributes={"DelaySeconds": "0"})["QueueUrl"]

        def answers() -> list[Any]:
            sqs.send_message(QueueUrl=url, MessageBody="m")
            got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
            return [
                {k: v for k, v in got.items() if not k.endswith("Timestamp")},
                utils.method_names_from_class(responses.BaseResponse),
            ]

        before = answers()
        with quicker_dispatch():
            assert sqs_models.camelcase_to_underscores is not real_snake
            during = answers()
        after = answers()
    assert during[1] == before[1] and during[0]["ApproximateNumberOfMessages"] == "2"
    assert {k: v for k, v in during[0].items() if k != "ApproximateNumberOfMessages"} == {
        k: v for k, v in before[0].items() if k != "ApproximateNumberOfMessages"
    }
    assert after[0]["ApproximateNumberOfMessages"] == "3"
    assert sqs_models.camelcase_to_underscores is real_snake is utils.camelcase_to_underscores  # put back
    assert responses.method_names_from_class is real_names
