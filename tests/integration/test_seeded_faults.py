"""The fault injector's seeded mode (spotguard_cli.emulator.faults), on SpotGuard's own clients over moto in
this process: the same seed faults the same calls the same way; a lost answer's effect stands; a cut
invocation leaves its whole SQS batch on the queue, which comes back after the visibility timeout and goes
to the dead-letter queue after maxReceiveCount, as Lambda and SQS do (the soak: tests/e2e/test_soak.py)."""

from __future__ import annotations

import json
import os
import random
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError
from moto import mock_aws

from spotguard.adapters import clients
from spotguard_cli.emulator.clockpatch import no_backoff
from spotguard_cli.emulator.faults import CUT, Injector, InvocationCut, moto_skips_answered_requests
from spotguard_cli.emulator.lambdas import FunctionHost, InvocationFailed, QueuePoller
from spotguard_cli.emulator.stack import DeployedStack, FunctionConfig


@pytest.fixture
def stack() -> Iterator[DeployedStack]:
    env = dict(os.environ)
    with mock_aws(), moto_skips_answered_requests(), no_backoff():
        clients.reset()
        stack = DeployedStack(endpoint=None, region="us-east-1", outputs={})
        stack.client("sqs").list_queues()  # moto's SQS loaded before the test's clock starts
        clients.client("sqs")
        yield stack
        clients.reset()
    os.environ.clear()
    os.environ.update(env)


def _injector(
    stack: DeployedStack, seed: int, rate: float, kinds: frozenset[str] | None = None
) -> tuple[Injector, list[str]]:
    said: list[str] = []
    injector = Injector(stack.client, {}, record=False)
    injector.install(("sqs",))
    injector.seeded(rate, random.Random(seed), say=said.append, kinds=kinds)
    return injector, said


def _calls(injector: Injector, n: int) -> list[str]:
    """n calls of SpotGuard's clients, and what each ended in."""
    sqs = clients.client("sqs")
    with injector.paused():
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
    out = []
    for i in range(n):
        try:
            sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
            out.append("ok")
        except InvocationCut:
            out.append("cut")
        except (ClientError, ReadTimeoutError) as exc:
            out.append(type(exc).__name__)
    return out


def test_the_same_seed_faults_the_same_calls_the_same_way(stack: DeployedStack):
    injector, said = _injector(stack, seed=7, rate=0.3)
    first = _calls(injector, 60)
    fired = dict(injector.fired)
    assert sum(fired.values()) == len(said) > 5 and "ok" in first and len(set(first)) > 2
    clients.reset()
    stack.client("sqs").delete_queue(QueueUrl=stack.client("sqs").get_queue_url(QueueName="q")["QueueUrl"])
    again, said_again = _injector(stack, seed=7, rate=0.3)
    assert _calls(again, 60) == first and said_again == said and dict(again.fired) == fired
    clients.reset()
    stack.client("sqs").delete_queue(QueueUrl=stack.client("sqs").get_queue_url(QueueName="q")["QueueUrl"])
    other, said_other = _injector(stack, seed=8, rate=0.3)
    _calls(other, 60)
    assert said_other != said


def test_a_lost_answer_took_effect_once_or_twice_and_a_throttle_did_not(stack: DeployedStack):
    injector, said = _injector(stack, seed=1, rate=1.0, kinds=frozenset({"lost"}))
    sqs = clients.client("sqs")
    with injector.paused():
        url = sqs.create_queue(QueueName="lost")["QueueUrl"]
    with pytest.raises(ReadTimeoutError):
        sqs.send_message(QueueUrl=url, MessageBody="sent")
    (message,) = stack.client("sqs").receive_message(QueueUrl=url)["Messages"]
    assert message["Body"] == "sent" and said == ["fault: lost at SendMessage:queue#1"]
    stack.client("sqs").purge_queue(QueueUrl=url)
    injector.seeded(1.0, random.Random(1), kinds=frozenset({"lost-retried"}))
    sqs.send_message(QueueUrl=url, MessageBody="twice")  # lost, then sent again by botocore's retry
    twice = stack.client("sqs").receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in twice] == ["twice", "twice"] and injector.fired["lost-retried"] == 1
    injector.seeded(1.0, random.Random(1), kinds=frozenset({"throttle-exhaust"}))
    with pytest.raises(ClientError, match="ThrottlingException"):
        sqs.send_message(QueueUrl=url, MessageBody="throttled")
    assert "Messages" not in stack.client("sqs").receive_message(QueueUrl=url, VisibilityTimeout=0)


def test_a_cut_invocation_leaves_its_batch_on_the_queue_until_the_dead_letter_queue(
    stack: DeployedStack, tmp_path: Path
):
    (tmp_path / "app.py").write_text(
        textwrap.dedent(
            """
            from spotguard.adapters import clients

            def handler(event, context):
                sqs = clients.client("sqs")
                url = sqs.get_queue_url(QueueName="out")["QueueUrl"]
                for record in event["Records"]:
                    sqs.send_message(QueueUrl=url, MessageBody=record["body"])
                return {"batchItemFailures": []}
            """
        )
    )
    sqs = stack.client("sqs")
    out = sqs.create_queue(QueueName="out")["QueueUrl"]
    dlq = sqs.create_queue(QueueName="dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})
    url = sqs.create_queue(QueueName="work", Attributes={"VisibilityTimeout": "0", "RedrivePolicy": redrive})[
        "QueueUrl"
    ]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    fn = FunctionConfig("Fn", "fn", tmp_path, "app.handler", {}, queue_arn=arn, queues={arn: 10})
    host = FunctionHost(stack, fn)
    poller = QueuePoller(stack, host)
    for name in ("/a", "/b"):
        sqs.send_message(QueueUrl=url, MessageBody=name)
    injector, said = _injector(stack, seed=3, rate=1.0, kinds=frozenset({CUT}))

    with pytest.raises(InvocationFailed, match="cut at GetQueueUrl#1"):
        host.invoke({"Records": [{"body": "/direct"}]})  # a direct invocation: Lambda's error
    assert poller.poll_once() == (2, 2)  # cut at its first call: neither record done, none deleted
    assert poller.poll_once() == (2, 2)  # back after the visibility timeout (0 here)
    assert poller.poll_once() == (0, 0)  # received twice: moved to the dead-letter queue
    assert sorted(
        m["Body"] for m in sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10)["Messages"]
    ) == [
        "/a",
        "/b",
    ]
    assert injector.fired[CUT] == 3 == len(said)
    assert "Messages" not in sqs.receive_message(QueueUrl=out)  # nothing after the cut ran
