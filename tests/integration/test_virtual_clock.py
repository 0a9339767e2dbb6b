"""The whole system in this process on a virtual clock (spotguard_cli.emulator.vclock): SQS's delays and
visibility timeouts, moto's dates and SpotGuard's own follow it, nothing waits in real time, and a seeded
run repeats exactly."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from moto import mock_aws

from spotguard.domain import clock as spotguard_clock
from spotguard_cli.emulator.template import REPO
from spotguard_cli.emulator.vclock import VirtualClock, installed
from spotguard_cli.emulator.world import make_jobs_world

from .conftest import fresh_aws

pytestmark = pytest.mark.slow  # the stack is deployed into moto

START = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)


def test_sqs_delays_and_visibility_and_moto_dates_follow_the_virtual_clock():
    clock = VirtualClock(START)
    began = time.monotonic()
    with installed(clock, seed=1), mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q", Attributes={"VisibilityTimeout": "60"})["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="x", DelaySeconds=30)
        assert "Messages" not in sqs.receive_message(QueueUrl=url)
        clock.advance(29)
        assert "Messages" not in sqs.receive_message(QueueUrl=url)
        clock.advance(1)
        (m,) = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
        assert int(m["Attributes"]["SentTimestamp"]) == int(START.timestamp() * 1000)
        assert "Messages" not in sqs.receive_message(QueueUrl=url)  # invisible for 60 s
        clock.advance(60.001)  # moto: visible once strictly past its visibility timeout
        (again,) = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
        assert again["Attributes"]["ApproximateReceiveCount"] == "2"
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="virtual-clock-bucket")
        s3.put_object(Bucket="virtual-clock-bucket", Key="k", Body=b"1")
        assert s3.head_object(Bucket="virtual-clock-bucket", Key="k")["LastModified"] == clock.now().replace(
            microsecond=0
        )
        assert spotguard_clock.now() == clock.now()
    assert (
        spotguard_clock.now() > datetime(2026, 1, 1, tzinfo=UTC) and spotguard_clock.now() < START
    )  # wall again
    assert time.monotonic() - began < 10  # 90 s of queue time, not waited for


def test_a_job_waiting_for_capacity_comes_back_when_the_virtual_clock_passes_its_retry():
    """RunTask places nothing (every 8-GPU host taken): the job's retry message is due 30 s later by the
    virtual clock, and SpotGuard's dates are the clock's."""
    clock = VirtualClock(START)
    with installed(clock, seed=7), fresh_aws():
        jobs = make_jobs_world(env={"SPOTGUARD_RETRY_BASE_SECONDS": "30"})
        for _ in ("a8", "b8"):  # two jobs take both 8-GPU hosts
            assert jobs.submit(gpus=8)["state"] == "running"
        job = jobs.submit(gpus=8)
        assert job["state"] == "queued" and job["created_at"].startswith("2030-01-07T09:00:00")
        clock.advance(29)
        jobs.retries.drain()
        assert jobs.status(job["job_id"])["state"] == "queued"  # not due yet: the message is still delayed
        clock.advance(1)
        jobs.retries.drain()
        status = jobs.status(job["job_id"])
        assert status["state"] == "queued" and status["retry_at"].startswith(
            "2030-01-07T09:01:30"
        )  # 30 s, then 60
        jobs.hosts["a8b"] = jobs.cluster.add_host("g5.48xlarge", "us-east-1a")
        clock.advance(60)
        jobs.retries.drain()
        status = jobs.status(job["job_id"])
        assert status["state"] == "running" and status["attempts"][0]["launched_at"].startswith(
            "2030-01-07T09:01:30"
        )


SCRIPT = """
import hashlib, json, sys, warnings
warnings.filterwarnings("ignore")
from tests.integration.test_virtual_clock import scripted_run
print(scripted_run(int(sys.argv[1])))
"""


def scripted_run(seed: int) -> str:
    """Submit, run, interrupt and relaunch a job on the virtual clock; a digest of what the system wrote
    (the job's status: its ids, the tasks', the notice's, every time)."""
    clock = VirtualClock(START)
    with installed(clock, seed=seed), fresh_aws():
        jobs = make_jobs_world()
        job = jobs.submit(gpus=1)
        clock.advance(5)
        jobs.emit(job["task_arn"])
        clock.advance(600)
        jobs.commit_checkpoint(job, 1, at=clock.now())
        clock.advance(60)
        jobs.interrupt(jobs.hosts["a1"])
        clock.advance(30)
        jobs.emit(job["task_arn"], exit_code=75)
        status = jobs.status(job["job_id"])
        assert status["state"] == "running" and len(status["attempts"]) == 2
        return hashlib.sha256(json.dumps(status, sort_keys=True).encode()).hexdigest()


def _run_apart(seed: int) -> str:
    """One run in a process of its own, as two runs of a command are (the same hash seed for both)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(seed)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_same_seed_gives_the_same_run_byte_for_byte():
    first, second = _run_apart(3), _run_apart(3)
    assert first == second
    assert _run_apart(4) != first  # another seed: other ids (the job's own among them)


def test_one_thread_makes_every_side_by_side_call_in_order_and_raises_the_first_failure_after_all():
    from concurrent.futures import Future

    from spotguard.usecases.interruption import InterruptionService
    from spotguard_cli.emulator.vclock import one_thread

    real = InterruptionService._side_by_side
    made: list[str] = []

    def call(name: str, fails: bool = False) -> Any:
        def run() -> str:
            made.append(name)
            if fails:
                raise RuntimeError(name)
            return name

        return run

    with one_thread():
        assert InterruptionService._side_by_side is not real
        futures = InterruptionService._side_by_side(None, call("a"), call("b"))
        assert [f.result() for f in futures] == ["a", "b"] and all(isinstance(f, Future) for f in futures)
        with pytest.raises(RuntimeError, match=r"^b$"):
            InterruptionService._side_by_side(
                None, call("a"), call("b", fails=True), call("c", True), call("d")
            )
        assert made == ["a", "b", "a", "b", "c", "d"]  # every stop tried, the first failure raised
    assert InterruptionService._side_by_side is real
