"""The notifications' and alerts' contract (adapters/notify.py: Notifier, TopicAlerts), the same cases
against their fakes (tests/fakes.py FakeNotifier, FakeAlerts) and against the adapters on moto: every
job notification sent reaches the event bus, once, with its id, job, kind, message and detail; those of
a kind worth an e-mail reach the topic as well, the others do not; an alert reaches the topic with its
subject (cut to the 100 characters SNS takes) and its detail.

On moto what reaches the bus is read as a user's automation gets it: a rule on the default bus for
source `spotguard`, whose target is an SQS queue (moto delivers PutEvents to it); what reaches a topic,
through an SQS queue subscribed to it. Only those are made, a new moto for each case. Not covered here:
EventBridge refusing an entry (moto takes every entry these adapters send) and a stack without a topic
(an adapter setting, not the port's behaviour)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from spotguard.adapters.notify import Notifier, TopicAlerts
from spotguard.domain.jobs.replies import Notification
from tests.contract.moto_aws import Clients, one_side
from tests.fakes import FakeAlerts, FakeNotifier

# What a notification's kind is worth: an e-mail (and an event), or an event only.
EMAILED_KINDS = ("interrupted", "resubmitted", "succeeded", "failed", "gave-up", "cancelled")
EVENT_ONLY_KINDS = ("waiting", "capacity-wanted", "decision")


@dataclass
class Side:
    name: str
    notifier: Any  # Notifier | FakeNotifier
    alerts: Any  # TopicAlerts | FakeAlerts
    events: Callable[[], list[Notification]]  # what reached the bus, by id
    emailed: Callable[[], list[Notification]]  # what reached the topic, by id
    alerted: Callable[[], list[tuple[str, dict[str, Any]]]]  # (subject, detail) that reached the topic


def _by_id(notifications: list[Notification]) -> list[Notification]:
    return sorted(notifications, key=lambda n: n.id)


def _notification(detail: dict[str, Any]) -> Notification:
    """A notification as its event's or message's detail carries it."""
    d = dict(detail)
    return Notification(
        id=d.pop("notification-id"),
        job_id=d.pop("job-id"),
        kind=d.pop("kind"),
        message=d.pop("message"),
        detail=d,
    )


class Delivered:
    """The bus and two topics on moto, each read through an SQS queue."""

    def __init__(self, aws: Clients) -> None:
        self.sqs = aws["sqs"]
        self.sns = aws["sns"]
        self.events = aws["events"]
        self.urls: dict[str, str] = {}
        self.topic = self.sns.create_topic(Name="spotguard-notifications")["TopicArn"]
        self.alerts_topic = self.sns.create_topic(Name="spotguard-alerts")["TopicArn"]
        self.sns.subscribe(TopicArn=self.topic, Protocol="sqs", Endpoint=self._queue("mail"))
        self.sns.subscribe(TopicArn=self.alerts_topic, Protocol="sqs", Endpoint=self._queue("alerts"))
        self.events.put_rule(Name="spotguard-jobs", EventPattern=json.dumps({"source": ["spotguard"]}))
        self.events.put_targets(Rule="spotguard-jobs", Targets=[{"Id": "bus", "Arn": self._queue("bus")}])

    def _queue(self, name: str) -> str:
        url = self.urls[name] = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        attributes = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
        return str(attributes["QueueArn"])

    def _bodies(self, queue: str) -> list[dict[str, Any]]:
        bodies: list[dict[str, Any]] = []
        while got := self.sqs.receive_message(QueueUrl=self.urls[queue], MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            for m in got:
                self.sqs.delete_message(QueueUrl=self.urls[queue], ReceiptHandle=m["ReceiptHandle"])
                bodies.append(json.loads(m["Body"]))
        return bodies

    def on_bus(self) -> list[Notification]:
        return _by_id([_notification(event["detail"]) for event in self._bodies("bus")])

    def emailed(self) -> list[Notification]:
        return _by_id([_notification(json.loads(m["Message"])) for m in self._bodies("mail")])

    def alerted(self) -> list[tuple[str, dict[str, Any]]]:
        return [(m["Subject"], json.loads(m["Message"])) for m in self._bodies("alerts")]


def fake_side() -> Side:
    notifier, alerts = FakeNotifier(), FakeAlerts()
    return Side(
        "fake",
        notifier,
        alerts,
        lambda: _by_id(notifier.sent),
        lambda: _by_id(notifier.emailed),
        lambda: [(subject, dict(detail)) for subject, detail in alerts.sent],
    )


def moto_side(aws: Clients) -> Side:
    d = Delivered(aws)
    return Side(
        "moto",
        Notifier(d.sns, d.events, d.topic),
        TopicAlerts(d.sns, d.alerts_topic),
        d.on_bus,
        d.emailed,
        d.alerted,
    )


@pytest.fixture(params=["fake", "moto"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    yield from one_side(request, ("sqs", "sns", "events"), fake_side, moto_side)


def note(n: int, kind: str, job_id: str = "j1", **detail: Any) -> Notification:
    return Notification(
        id=f"{job_id}:{n}:0", kind=kind, job_id=job_id, message=f"job {job_id} {kind}", detail=detail
    )


# ------------------------------------------------------------------------------------ notifications
def test_every_notification_reaches_the_bus_once_with_all_it_says(side: Side):
    sent = [
        note(1, "succeeded", exit_code=0, attempts=2),
        note(2, "waiting", "j2", reason="no capacity in any pool", retry_in=30),
        note(3, "decision", "j3", placement={"pool": "gpu-spot-a", "score": 9, "zones": ["us-east-1a"]}),
    ]
    side.notifier.send_all(sent)
    assert side.events() == _by_id(sent)


def test_only_the_kinds_worth_an_email_reach_the_topic(side: Side):
    sent = [note(i, kind) for i, kind in enumerate(EVENT_ONLY_KINDS + EMAILED_KINDS)]
    side.notifier.send_all(sent)
    assert side.emailed() == _by_id([n for n in sent if n.kind in EMAILED_KINDS])
    assert side.events() == _by_id(sent)  # every one is an event


def test_more_than_ten_at_once_all_reach_the_bus(side: Side):
    """PutEvents takes ten entries at a time: 23 notifications are three calls, none left out."""
    sent = [note(i, "interrupted" if i % 4 == 0 else "capacity-wanted", f"j{i:02d}") for i in range(23)]
    side.notifier.send_all(sent)
    assert side.events() == _by_id(sent)
    assert side.emailed() == _by_id([n for n in sent if n.kind == "interrupted"])


# ------------------------------------------------------------------------------------------- alerts
def test_an_alert_reaches_the_topic_with_its_subject_and_detail(side: Side):
    detail = {"kind": "checkpoint-bucket-check", "bucket": "users-bucket", "findings": ["a", "b"]}
    side.alerts.alert("SpotGuard: checkpoint bucket users-bucket lacks settings", detail)
    assert side.alerted() == [("SpotGuard: checkpoint bucket users-bucket lacks settings", detail)]


def test_an_alerts_subject_is_cut_to_the_100_characters_sns_takes(side: Side):
    bucket = "a-bucket-whose-name-is-as-long-as-s3-lets-a-name-be-and-then-some-more"
    subject = f"SpotGuard: checkpoint bucket {bucket} lacks settings"
    side.alerts.alert(subject, {"bucket": bucket})
    assert side.alerted() == [(subject[:100], {"bucket": bucket})]
