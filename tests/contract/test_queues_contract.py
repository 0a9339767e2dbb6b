"""The queues' contract (adapters/queues.py: FollowUpQueue, RetryQueue, DeadLetters), the same cases
against their fakes (tests/fakes.py FakeFollowUps, FakeRetries, FakeDeadLetters) and against the adapters
on moto: a Lifecycle Check (FollowUps) and a Launch Due (LaunchRetries) come back once their delay has
passed, never before, each once, at most SQS's 15 minutes later and at once for a delay below none, with
what was asked as the consuming function reads it; a rejected record (DeadLetters) reaches the dead-letter
queue with its reason and the id of the message it came in, in values SQS takes.

On moto, SQS's delays pass on a virtual clock (spotguard_cli.emulator.vclock, which moto reads its time
through): nothing waits. A message is read as its function reads it: a Lifecycle Check by the interruption
function's classify, a Launch Due by the task-events function's classify_task_message. Only the three
queues are made, a new moto for each case."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from spotguard.adapters.queues import DeadLetters, FollowUpQueue, RetryQueue
from spotguard.domain.interruption.classify import classify
from spotguard.domain.interruption.notices import LifecycleRef
from spotguard.domain.jobs.task_events import LaunchDueMessage, classify_task_message
from spotguard.domain.settings import Settings
from spotguard_cli.emulator.vclock import VirtualClock, installed
from tests.contract.moto_aws import one_side
from tests.fakes import DeadLetter, FakeDeadLetters, FakeFollowUps, FakeRetries

T0 = datetime(2026, 11, 21, 14, 46, 3, tzinfo=UTC)
HOST = "i-0b662ef9931388ba0"
REF = LifecycleRef(group="gpu-spot-asg", hook="spotguard-drain", token="87654321-4321-4321-4321-210987654321")
DEADLINE = T0 + timedelta(minutes=10)

# A Lifecycle Check as the interruption function reads it: (instance id, lifecycle action, deadline,
# notice key).
Check = tuple[str, LifecycleRef, datetime, str]


@dataclass
class Side:
    name: str
    follow_ups: Any  # FollowUpQueue | FakeFollowUps
    retries: Any  # RetryQueue | FakeRetries
    dead_letters: Any  # DeadLetters | FakeDeadLetters
    # what each queue delivers once so many seconds have passed since the case began, each message once
    checks_due: Callable[[float], list[Check]]
    launches_due: Callable[[float], list[tuple[str, int]]]
    dead_lettered: Callable[[], list[DeadLetter]]


def fake_side() -> Side:
    follow_ups, retries, dead_letters = FakeFollowUps(), FakeRetries(), FakeDeadLetters()

    def checks_due(after: float) -> list[Check]:
        due = [(f.instance_id, f.ref, f.deadline, f.notice_key) for f in follow_ups.due(after)]
        return sorted(due, key=repr)

    def dead_lettered() -> list[DeadLetter]:  # each read once, as from the queue
        taken, dead_letters.sent[:] = list(dead_letters.sent), []
        return sorted(taken)

    return Side(
        "fake",
        follow_ups,
        retries,
        dead_letters,
        checks_due,
        lambda after: sorted(retries.due(after)),
        dead_lettered,
    )


class Queues:
    """The three queues on moto, read as their functions read them; the virtual clock moves their time."""

    def __init__(self, clock: VirtualClock, sqs: Any) -> None:
        self.clock = clock
        self.sqs = sqs
        names = ("follow-ups", "retries", "dlq")
        self.urls = {n: self.sqs.create_queue(QueueName=n)["QueueUrl"] for n in names}

    def take(self, queue: str, after: float | None = None) -> list[dict[str, Any]]:
        """Every message the queue delivers now (`after` seconds since the case began), deleted as read."""
        if after is not None:
            self.clock.advance_to(T0 + timedelta(seconds=after))
        taken: list[dict[str, Any]] = []
        while got := self.sqs.receive_message(
            QueueUrl=self.urls[queue], MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        ).get("Messages", []):
            for m in got:
                self.sqs.delete_message(QueueUrl=self.urls[queue], ReceiptHandle=m["ReceiptHandle"])
            taken += got
        return taken

    def checks_due(self, after: float) -> list[Check]:
        checks: list[Check] = []
        for m in self.take("follow-ups", after):
            decision = classify(m["Body"], Settings())
            assert decision.outcome == "act", decision.reason
            (n,) = decision.notices
            assert n.lifecycle is not None and n.deadline is not None
            checks.append((n.instance_id, n.lifecycle, n.deadline, n.detail))
        return sorted(checks, key=repr)

    def launches_due(self, after: float) -> list[tuple[str, int]]:
        launches: list[tuple[str, int]] = []
        for m in self.take("retries", after):
            message = classify_task_message(m["Body"], Settings())
            assert isinstance(message, LaunchDueMessage), message.reason
            launches.append((message.job_id, message.launch_try))
        return sorted(launches)

    def dead_lettered(self) -> list[DeadLetter]:
        def attribute(m: dict[str, Any], name: str) -> str:
            return str(m["MessageAttributes"][name]["StringValue"])

        return sorted(
            DeadLetter(
                m["Body"],
                attribute(m, "spotguard-reject-reason"),
                attribute(m, "spotguard-source-message-id"),
            )
            for m in self.take("dlq")
        )


def moto_side(clock: VirtualClock, sqs: Any) -> Side:
    q = Queues(clock, sqs)
    return Side(
        "sqs",
        FollowUpQueue(q.sqs, q.urls["follow-ups"]),
        RetryQueue(q.sqs, q.urls["retries"]),
        DeadLetters(q.sqs, q.urls["dlq"]),
        q.checks_due,
        q.launches_due,
        q.dead_lettered,
    )


@pytest.fixture(params=["fake", "sqs"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    clock = VirtualClock(T0)  # moto's time: installed before moto starts
    yield from one_side(
        request,
        ("sqs",),
        fake_side,
        lambda aws: moto_side(clock, aws["sqs"]),
        within=lambda: installed(clock, seed=1),
    )


# ---------------------------------------------------------------------------------------- follow-ups
def test_a_lifecycle_check_comes_back_once_after_its_delay_with_what_was_asked(side: Side):
    side.follow_ups.lifecycle_check(HOST, REF, DEADLINE, "spot-interruption#e-1#" + HOST, 20)
    assert side.checks_due(0) == []
    assert side.checks_due(19) == []
    assert side.checks_due(20) == [(HOST, REF, DEADLINE, "spot-interruption#e-1#" + HOST)]
    assert side.checks_due(900) == []  # once


def test_each_check_asked_is_a_message_of_its_own(side: Side):
    other = LifecycleRef(group="gpu-spot-asg", hook="spotguard-drain", token="1" * 8 + REF.token[8:])
    side.follow_ups.lifecycle_check(HOST, REF, DEADLINE, "k-1", 30)
    side.follow_ups.lifecycle_check(HOST, REF, DEADLINE, "k-1", 30)  # a repeat: both come back
    side.follow_ups.lifecycle_check("i-0123456789abcdef0", other, DEADLINE + timedelta(seconds=1), "k-2", 10)
    assert side.checks_due(10) == [("i-0123456789abcdef0", other, DEADLINE + timedelta(seconds=1), "k-2")]
    assert side.checks_due(30) == [(HOST, REF, DEADLINE, "k-1")] * 2


def test_a_checks_delay_is_at_most_fifteen_minutes_and_never_below_none(side: Side):
    side.follow_ups.lifecycle_check(HOST, REF, DEADLINE, "late", 3600)
    side.follow_ups.lifecycle_check(HOST, REF, DEADLINE, "now", -5)
    assert side.checks_due(0) == [(HOST, REF, DEADLINE, "now")]
    assert side.checks_due(899) == []
    assert side.checks_due(900) == [(HOST, REF, DEADLINE, "late")]


# ------------------------------------------------------------------------------------------ retries
def test_a_launch_due_comes_back_once_after_its_delay_for_its_job_and_try(side: Side):
    side.retries.schedule("j1", 2, 30)
    side.retries.schedule("j2", 1, 5)
    assert side.launches_due(4) == []
    assert side.launches_due(5) == [("j2", 1)]
    assert side.launches_due(29) == []
    assert side.launches_due(30) == [("j1", 2)]
    assert side.launches_due(900) == []  # once


def test_a_launch_dues_delay_is_at_most_fifteen_minutes_and_never_below_none(side: Side):
    side.retries.schedule("j1", 7, 86_400)
    side.retries.schedule("j2", 3, 0)
    side.retries.schedule("j3", 1, -1)
    assert side.launches_due(0) == [("j2", 3), ("j3", 1)]
    assert side.launches_due(899) == []
    assert side.launches_due(900) == [("j1", 7)]


# ------------------------------------------------------------------------------------- dead letters
def test_a_rejected_record_reaches_the_dead_letter_queue_with_its_reason_and_source(side: Side):
    side.dead_letters.send('{"source": "aws.ec2"}', "detail-type: field required", "m-1")
    side.dead_letters.send("not json", "not an EventBridge event", "m-2")
    assert side.dead_lettered() == [  # sorted: SQS keeps no order
        DeadLetter("not json", "not an EventBridge event", "m-2"),
        DeadLetter('{"source": "aws.ec2"}', "detail-type: field required", "m-1"),
    ]
    assert side.dead_lettered() == []  # once


def test_what_sqs_would_refuse_is_still_dead_lettered(side: Side):
    """SQS takes no empty body nor attribute value: they arrive as "(empty)" and "-"; a reason is cut
    at 1000 characters."""
    side.dead_letters.send("", "", "")
    side.dead_letters.send("x", "why " * 400, "m-3")
    cut = ("why " * 400)[:1000]
    assert side.dead_lettered() == [DeadLetter("(empty)", "-", "-"), DeadLetter("x", cut, "m-3")]
