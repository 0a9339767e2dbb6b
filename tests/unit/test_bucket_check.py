"""The check of a checkpoint bucket the user brought: each missing setting said plainly, at first use and
then once an hour, alerted when the findings change, and never an exception that stops the sweep."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from spotguard.ports import PUBLIC_ACCESS_SETTINGS, BucketFacts
from spotguard.usecases.bucket_check import BucketCheck, missing
from tests.fakes import FakeAlerts, FakeBucketSettings

RIGHT = BucketFacts(
    versioning="Enabled",
    encryption="AES256",
    public_access_block=dict.fromkeys(PUBLIC_ACCESS_SETTINGS, True),
    eventbridge=True,
)
BARE = BucketFacts(versioning=None, encryption=None, public_access_block=None, eventbridge=False)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 23, 12, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def _check(
    facts: BucketFacts | Exception, alerts: FakeAlerts | None = None
) -> tuple[BucketCheck, FakeBucketSettings, FakeAlerts, Clock]:
    if isinstance(facts, Exception):
        settings = FakeBucketSettings(failure=facts)
    else:
        settings = FakeBucketSettings({"users-bucket": facts})
    alerts, clock = alerts or FakeAlerts(), Clock()
    return BucketCheck("users-bucket", settings, alerts, clock), settings, alerts, clock


def test_a_right_bucket_has_no_findings():
    assert missing(RIGHT) == []


def test_each_missing_setting_is_one_plain_sentence():
    findings = missing(BARE)
    assert len(findings) == 4
    versioning, encryption, block, events = findings
    assert versioning.startswith("versioning is never turned on")
    assert encryption.startswith("no default encryption")
    assert block.startswith("the bucket's public access block is not fully on")
    assert all(s in block for s in PUBLIC_ACCESS_SETTINGS)
    assert events.startswith("Amazon EventBridge notifications are off")
    suspended = BucketFacts(**{**RIGHT.__dict__, "versioning": "Suspended"})
    assert missing(suspended) == [
        "versioning is suspended: a checkpoint overwritten or deleted by mistake cannot be brought back"
    ]


def test_a_public_access_block_with_one_setting_off_names_that_setting():
    half = BucketFacts(
        **{**RIGHT.__dict__, "public_access_block": {**RIGHT.public_access_block, "BlockPublicPolicy": False}}
    )  # type: ignore[dict-item]
    (finding,) = missing(half)
    assert "(BlockPublicPolicy off)" in finding


def test_a_setting_that_cannot_be_read_is_a_finding_not_a_guess():
    denied = BucketFacts(
        **{**RIGHT.__dict__, "eventbridge": False, "unreadable": {"eventbridge": "AccessDenied"}}
    )
    assert missing(denied) == ["the notification configuration could not be read (AccessDenied)"]
    versioning = BucketFacts(
        **{**RIGHT.__dict__, "versioning": None, "unreadable": {"versioning": "AccessDenied"}}
    )
    assert missing(versioning) == ["versioning could not be read (AccessDenied)"]


def test_checked_at_first_use_then_once_an_hour():
    check, settings, _, clock = _check(RIGHT)
    assert check.run() == []
    assert check.run() is None and settings.reads == 1
    clock.now += timedelta(minutes=59)
    assert check.run() is None and settings.reads == 1
    clock.now += timedelta(minutes=1)
    assert check.run() == [] and settings.reads == 2


def test_findings_are_logged_at_warning_level_every_time(caplog):
    check, _, _, clock = _check(BARE)
    with caplog.at_level(logging.WARNING, logger="spotguard.usecases.bucket_check"):
        check.run()
        clock.now += timedelta(hours=1)
        check.run()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 8
    assert all("checkpoint bucket users-bucket:" in r.getMessage() for r in warnings)


def test_an_alert_goes_to_the_topic_when_the_findings_change_and_not_every_hour():
    check, settings, alerts, clock = _check(BARE)
    check.run()
    ((subject, detail),) = alerts.sent
    assert subject == "SpotGuard: checkpoint bucket users-bucket lacks settings"
    assert detail["bucket"] == "users-bucket" and detail["findings"] == missing(BARE)
    clock.now += timedelta(hours=1)
    check.run()
    assert len(alerts.sent) == 1  # the same findings: logged, not mailed again
    settings.buckets["users-bucket"] = BucketFacts(**{**BARE.__dict__, "versioning": "Enabled"})
    clock.now += timedelta(hours=1)
    check.run()
    assert len(alerts.sent) == 2 and len(alerts.sent[1][1]["findings"]) == 3  # type: ignore[arg-type]
    settings.buckets["users-bucket"] = RIGHT  # put right: nothing sent, and a later regression is sent again
    clock.now += timedelta(hours=1)
    assert check.run() == [] and len(alerts.sent) == 2
    settings.buckets["users-bucket"] = BARE
    clock.now += timedelta(hours=1)
    check.run()
    assert len(alerts.sent) == 3


@pytest.mark.parametrize("failure", ["read", "alert"])
def test_a_failing_read_or_alert_never_stops_the_sweep(failure):
    if failure == "read":
        check, _, alerts, _ = _check(RuntimeError("endpoint unreachable"))
        (finding,) = check.run() or []
        assert finding == "its settings could not be read (RuntimeError: endpoint unreachable)"
        assert alerts.sent  # said, not swallowed
    else:
        check, _, alerts, clock = _check(BARE, FakeAlerts(fail=True))
        assert len(check.run() or []) == 4
        alerts.fail = False
        clock.now += timedelta(hours=1)
        check.run()
        assert len(alerts.sent) == 1  # the alert that failed is sent at the next check
