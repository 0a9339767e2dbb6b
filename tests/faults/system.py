"""The system the fault cases run in, and the three paths they break: the whole stack over moto in this
process (`make_jobs_world`), SpotGuard's clients hooked by an `Injector`, and clocks the tests move when
they play the time SQS waits before it delivers a failed record again.

A path is what one case runs: `prepare` (fault-free), `stimulus` (the record the fault lands in, and
its first delivery), then `settle` (SQS's redeliveries, the launch retries and a reconcile run) and
`check` (the end state). `record_ops` runs a path once without a fault and lists the calls it made,
so that the cases follow the code rather than a list kept by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from moto.ecs.models import ecs_backends

from spotguard.adapters import clients
from spotguard_cli.emulator.clockpatch import no_backoff, powertools_clock
from spotguard_cli.emulator.faults import Call, Injector, moto_skips_answered_requests
from spotguard_cli.emulator.gpucluster import Host
from spotguard_cli.emulator.inject import container_instance_event, make_event
from spotguard_cli.emulator.lambdas import QueuePoller
from spotguard_cli.emulator.world import JobsWorld, make_jobs_world

_ids = itertools.count(1)


@dataclass
class FaultWorld:
    jobs: JobsWorld
    injector: Injector
    pt_clock: Any
    offset: float = 0.0
    _visibility: dict[str, int] = field(default_factory=dict)
    _redelivered: dict[str, int] = field(default_factory=dict)  # queue -> failed receipts handed back

    # ------------------------------------------------------------------------------------ the parts
    @property
    def pollers(self) -> list[QueuePoller]:
        j = self.jobs
        return [j.interruptions, j.task_events, j.retries, j.checkpoints]

    @property
    def outputs(self) -> dict[str, str]:
        return self.jobs.stack.outputs

    @property
    def sqs(self) -> Any:
        return self.jobs.stack.client("sqs")

    def ledger_table(self) -> str:
        return self.jobs.stack.functions["JobsFunction"].environment["SPOTGUARD_LEDGER_TABLE"]

    # -------------------------------------------------------------------------------- time passing
    def advance(self, seconds: float) -> None:
        """Every function's clock and Powertools' idempotency clock move `seconds` on."""
        self.offset += seconds
        self._set_clocks()

    def reset_time(self) -> None:
        self.offset = 0.0
        self._set_clocks()

    def _set_clocks(self) -> None:
        offset = self.offset
        self.jobs.shift_clock(offset)
        self.jobs.interruptions.host.module.runtime.service.clock = lambda: (
            datetime.now(UTC) + timedelta(seconds=offset)
        )
        self.pt_clock.offset = timedelta(seconds=offset)

    def visibility(self, poller: QueuePoller) -> int:
        if poller.queue_url not in self._visibility:
            attrs = self.sqs.get_queue_attributes(QueueUrl=poller.queue_url, AttributeNames=["All"])
            self._visibility[poller.queue_url] = int(attrs["Attributes"]["VisibilityTimeout"])
        return self._visibility[poller.queue_url]

    # --------------------------------------------------------------------------------- redelivery
    def settle(self, rounds: int = 10) -> None:
        """Deliver what is on the queues until nothing fails: a failed record comes back once its queue's
        visibility timeout has passed (the clocks move that far), as SQS hands it back, and after
        maxReceiveCount receives it goes to the dead-letter queue. Launch retries (delayed messages) are
        waited for."""
        for _ in range(rounds):
            wait = 0
            for poller in self.pollers:
                poller.drain()
                before = self._redelivered.get(poller.queue_url, 0)
                self._redelivered[poller.queue_url] = len(poller.failed_receipts)
                for receipt in poller.failed_receipts[before:]:
                    with contextlib.suppress(Exception):  # moved to the dead-letter queue meanwhile
                        self.sqs.change_message_visibility(
                            QueueUrl=poller.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
                        )
                    wait = max(wait, self.visibility(poller))
            delayed = self._delayed()
            if not wait and not delayed:
                return
            if wait:
                self.advance(wait + 1)
            if delayed and not wait:  # a launch retry, due in a second or two (the world's base is 1 s)
                self.advance(delayed + 1)
                deadline = time.monotonic() + delayed + 2
                while self._delayed() and time.monotonic() < deadline:
                    time.sleep(0.1)

    def _delayed(self) -> int:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=self.jobs.retries.queue_url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
        )["Attributes"]
        return int(attrs.get("ApproximateNumberOfMessagesDelayed", 0))

    def reconcile(self) -> dict[str, int]:
        """The schedule's run, late enough for a launch left half-done to count as stuck."""
        self.advance(600)
        return self.jobs.reconcile()

    # ---------------------------------------------------------------------------------- end state
    def dead_letters(self) -> dict[str, list[str]]:
        """Every dead-letter queue's messages, as (reason or body) lines; read without consuming them."""
        out: dict[str, list[str]] = {}
        for name in (
            "InterruptionsDeadLetterQueueUrl",
            "TaskEventsDeadLetterQueueUrl",
            "CheckpointsDeadLetterQueueUrl",
        ):
            url = self.outputs[name]
            msgs = self.sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], VisibilityTimeout=0
            ).get("Messages", [])
            if msgs:
                out[name] = [
                    (m.get("MessageAttributes", {}).get("spotguard-reject-reason", {}).get("StringValue"))
                    or ("redriven after maxReceiveCount: " + m["Body"][:200])
                    for m in msgs
                ]
        return out

    def purge_dead_letters(self) -> None:
        for name in (
            "InterruptionsDeadLetterQueueUrl",
            "TaskEventsDeadLetterQueueUrl",
            "CheckpointsDeadLetterQueueUrl",
        ):
            with contextlib.suppress(Exception):
                self.sqs.purge_queue(QueueUrl=self.outputs[name])

    def pending(self) -> dict[str, int]:
        """Messages still on the functions' queues (visible, in flight or delayed)."""
        out = {}
        for poller in self.pollers:
            attrs = self.sqs.get_queue_attributes(QueueUrl=poller.queue_url, AttributeNames=["All"])[
                "Attributes"
            ]
            n = sum(
                int(attrs.get(k, 0))
                for k in (
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                )
            )
            if n:
                out[poller.queue_arn.rsplit(":", 1)[-1]] = n
        return out

    def effective(self, op: str) -> list[Call]:
        return [c for c in self.injector.effective if c.op == op]


@contextlib.contextmanager
def fault_world() -> Iterator[FaultWorld]:
    """The world, under moto (the caller holds `fresh_aws`), with the injector on SpotGuard's clients,
    botocore's backoff sleeps skipped and its retry quota unlimited (so that one case's exhausted
    retries cannot change the next case's), and Powertools' clock in the tests' hands."""
    jobs = make_jobs_world()
    stack = jobs.stack
    env = stack.functions["JobsFunction"].environment
    tables = {
        env["SPOTGUARD_LEDGER_TABLE"]: "ledger",
        env["SPOTGUARD_IDEMPOTENCY_TABLE"]: "idempotency",
        stack.functions["InterruptionFunction"].environment["SPOTGUARD_IDEMPOTENCY_TABLE"]: "idempotency",
        env["SPOTGUARD_RETRY_QUEUE_URL"]: "retry-queue",
    }
    for name, short in (
        ("InterruptionsQueueUrl", "interruptions-queue"),
        ("InterruptionsDeadLetterQueueUrl", "dead-letter-queue"),
        ("TaskEventsDeadLetterQueueUrl", "dead-letter-queue"),
        ("CheckpointsDeadLetterQueueUrl", "dead-letter-queue"),
    ):
        tables[stack.outputs[name]] = short
    injector = Injector(stack.client, tables)
    injector.install()

    with powertools_clock() as pt_clock, moto_skips_answered_requests(), no_backoff():
        world = FaultWorld(jobs, injector, pt_clock)
        yield world
    clients.reset()


# ======================================================================================== the paths
@dataclass
class Case:
    """What `prepare` made, for `stimulus` and `check`."""

    data: dict[str, Any]


class Path:
    name = ""

    def prepare(self, w: FaultWorld) -> Case:
        raise NotImplementedError

    def stimulus(self, w: FaultWorld, case: Case) -> None:
        raise NotImplementedError

    def check(self, w: FaultWorld, case: Case) -> None:
        raise NotImplementedError

    def cleanup(self, w: FaultWorld, case: Case) -> None:
        return None

    def done(self, w: FaultWorld, case: Case) -> bool:
        """Whether redelivery alone finished the work (else reconcile has some left to do)."""
        return True


def _set_exit_code(w: FaultWorld, arn: str, code: int) -> None:
    stack = w.jobs.stack
    task = ecs_backends[stack.account][stack.region].tasks["gpu-spot"][arn]
    for c in task.containers:
        c.exitCode = code


def _host_of(w: FaultWorld, task_arn: str) -> Host:
    ci = w.jobs.scheduler.placed[task_arn]
    return next(h for h in w.jobs.cluster.hosts if h.container_instance_arn == ci)


class InterruptionPath(Path):
    """A spot warning for a host (indexed by its container instance event) with two managed tasks and an
    unmanaged one: ledger writes, the drain, ListTasks, DescribeTasks, a StopTask per managed task."""

    name = "interruption"

    def prepare(self, w: FaultWorld) -> Case:
        cluster = w.jobs.cluster
        host = cluster.add_host("g5.12xlarge", "us-east-1c")
        # the scheduler must not place jobs' tasks here: its GPUs are taken by these tasks
        managed = cluster.start(host, cluster.gpu_task_definition(gpus=2), count=2)
        for arn in managed:
            w.jobs.scheduler.placed[arn], w.jobs.scheduler.gpus[arn] = host.container_instance_arn, 2
        unmanaged = cluster.start(host, cluster.cpu_task_definition(), managed=False)
        sqs, url = w.sqs, w.jobs.interruptions.queue_url
        sqs.send_message(
            QueueUrl=url, MessageBody=json.dumps(container_instance_event(cluster.describe_host(host)))
        )
        w.jobs.interruptions.drain()
        return Case({"host": host, "managed": managed, "unmanaged": unmanaged})

    def stimulus(self, w: FaultWorld, case: Case) -> None:
        host: Host = case.data["host"]
        warning = make_event("spot-interruption", host.instance_id)
        w.sqs.send_message(QueueUrl=w.jobs.interruptions.queue_url, MessageBody=json.dumps(warning))
        w.jobs.interruptions.drain()

    def check(self, w: FaultWorld, case: Case) -> None:
        host: Host = case.data["host"]
        managed, unmanaged = case.data["managed"], case.data["unmanaged"]
        assert w.jobs.cluster.describe_host(host)["status"] == "DRAINING"
        tasks = w.jobs.cluster.tasks(managed + unmanaged)
        assert {a: tasks[a]["desiredStatus"] for a in managed} == dict.fromkeys(managed, "STOPPED")
        assert tasks[unmanaged[0]]["desiredStatus"] == "RUNNING", "an unmanaged task was stopped"
        stops = [json.dumps(c.params) for c in w.effective("StopTask")]
        per_task = {a: sum(a in s for s in stops) for a in managed + unmanaged}
        assert per_task == {**dict.fromkeys(managed, 1), unmanaged[0]: 0}, f"StopTask per task: {per_task}"
        reasons = {tasks[a]["stoppedReason"] for a in managed}
        assert all(r.startswith("SpotGuard: spot-interruption ") for r in reasons), reasons
        notices = w.jobs.interruptions.host.module.runtime.ledger.notices(host.instance_id)
        (notice,) = [n for n in notices if n["kind"] == "spot-interruption"]
        outcome = json.loads(notice["outcome"])
        assert sorted(outcome["signalled"]) == sorted(managed), f"the notice records {outcome}"

    def cleanup(self, w: FaultWorld, case: Case) -> None:
        for arn in case.data["managed"]:
            w.jobs.scheduler.release(arn)


class ResubmitPath(Path):
    """The STOPPED event (exit 75) of a job's task that SpotGuard stopped for a spot warning, down to the
    RunTask of the next attempt: the job's reads and compare-and-set writes, the stop claim, the newest
    checkpoint, RunTask, the notifications (SNS and EventBridge) and their outbox."""

    name = "resubmit"

    def prepare(self, w: FaultWorld) -> Case:
        jobs = w.jobs
        jobs.cluster.add_host("g5.xlarge", "us-east-1b")  # capacity for this case's second attempt
        job = jobs.submit(gpus=1)
        arn1 = job["task_arn"]
        jobs.emit(arn1)  # RUNNING
        for sequence in (1, 2):  # committed by the agent; the bucket's events reach the checkpoints queue
            newest = CheckpointPath.write(w, job["checkpoint_uri"], job["job_id"], sequence)
        jobs.checkpoints.drain()
        host = _host_of(w, arn1)
        # stopped by SpotGuard for a spot warning (the interruption path's own cases are above); the
        # agent committed and exited 75
        jobs.stop(arn1, f"SpotGuard: spot-interruption {next(_ids)} on {host.instance_id}", exit_code=75)
        jobs.job_events(), jobs.notifications()  # what came before the stop is not this case's
        return Case({"job": job, "arn1": arn1, "newest": newest, "host": host})

    def done(self, w: FaultWorld, case: Case) -> bool:
        status = w.jobs.status(case.data["job"]["job_id"])
        return status["state"] == "running" and len(status["attempts"]) == 2

    def stimulus(self, w: FaultWorld, case: Case) -> None:
        w.jobs.put(w.jobs.event(case.data["arn1"], exit_code=75))
        w.jobs.task_events.drain()

    def check(self, w: FaultWorld, case: Case) -> None:
        jobs, job_id, newest = w.jobs, case.data["job"]["job_id"], case.data["newest"]
        status = jobs.status(job_id)
        assert status["state"] == "running", (status["state"], status["last_reason"])
        first, second = status["attempts"]
        assert first["outcome"] == "resubmit", first
        assert second["resume_from"] == newest
        # one task per attempt, and only the newest attempt's is live
        for number in (1, 2):
            sb = f"spotguard/{job_id}/{number}"
            requests = [r for r in jobs.scheduler.requests if r.get("startedBy") == sb]
            tasks = {
                jobs.scheduler.by_token[r["clientToken"]]
                for r in requests
                if r["clientToken"] in jobs.scheduler.by_token
            }
            assert len(tasks) == 1, f"attempt {number} started {len(tasks)} tasks"
            if number == 2:
                envs = [
                    {e["name"]: e["value"] for e in o["environment"]}
                    for r in requests
                    for o in r["overrides"]["containerOverrides"]
                ]
                assert {e["SPOTGUARD_RESUME_FROM"] for e in envs} == {newest}
                assert jobs.task(second["task_arn"])["desiredStatus"] == "RUNNING"
        assert jobs.task(first["task_arn"])["lastStatus"] == "STOPPED"
        # notifications: each kind sent at least once (a repeat carries the same id), none left behind
        mails = [m for m in jobs.notifications() if m.get("job-id") == job_id]
        events = [e["detail"] for e in jobs.job_events() if e["detail"].get("job-id") == job_id]
        for kind in ("interrupted", "resubmitted"):
            assert any(m["kind"] == kind for m in mails), f"no {kind} mail"
            assert any(e["kind"] == kind for e in events), f"no {kind} event"
        ids = {}
        for e in events:
            ids.setdefault((e["kind"], e["attempt"]), set()).add(e["notification-id"])
        assert all(len(v) == 1 for v in ids.values()), f"one notification sent under two ids: {ids}"
        doc = _job_doc(w, job_id)
        assert doc["outbox"] == [], f"notifications left in the outbox: {doc['outbox']}"
        case.data["arn2"] = second["task_arn"]

    def cleanup(self, w: FaultWorld, case: Case) -> None:
        arn2 = case.data.get("arn2") or w.jobs.status(case.data["job"]["job_id"]).get("task_arn")
        if arn2 and arn2 != case.data["arn1"]:
            w.jobs.stop(arn2, exit_code=0)
            w.jobs.emit(arn2, exit_code=0)  # the job succeeds: reconcile leaves it alone from now on


def _job_doc(w: FaultWorld, job_id: str) -> dict[str, Any]:
    item = w.jobs.stack.client("dynamodb").get_item(
        TableName=w.ledger_table(),
        Key={"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "JOB"}},
        ConsistentRead=True,
    )["Item"]
    return dict(json.loads(item["doc"]["S"]))


class CheckpointPath(Path):
    """The manifest event of a job's second committed checkpoint: S3 GetObject of the manifest, the
    ledger's record of it and the job's newest checkpoint (a conditional write)."""

    name = "checkpoint"

    def prepare(self, w: FaultWorld) -> Case:
        job_id = f"job-faults-{next(_ids)}"
        bucket = w.outputs["CheckpointBucketName"]
        prefix = f"jobs/{job_id}/"
        self.write(w, f"s3://{bucket}/{prefix}", job_id, 1)
        w.jobs.checkpoints.drain()
        return Case({"job_id": job_id, "bucket": bucket, "prefix": prefix})

    def stimulus(self, w: FaultWorld, case: Case) -> None:
        d = case.data
        key = self.write(w, f"s3://{d['bucket']}/{d['prefix']}", d["job_id"], 2).split("/", 3)[3]
        d["key"] = key
        if not w.pending():  # the bucket's own EventBridge notification did not come: send it as it would
            event = make_event("checkpoint-manifest", "i-00000000")
            event["detail"]["bucket"]["name"], event["detail"]["object"]["key"] = d["bucket"], key
            w.sqs.send_message(QueueUrl=w.jobs.checkpoints.queue_url, MessageBody=json.dumps(event))
        w.jobs.checkpoints.drain()

    def check(self, w: FaultWorld, case: Case) -> None:
        d = case.data
        uri = f"s3://{d['bucket']}/{d['prefix']}"
        ledger = w.jobs.checkpoints.host.module.runtime.ledger
        newest = ledger.newest_checkpoint(uri)
        assert newest is not None and newest.sequence == 2, newest
        assert newest.manifest_uri == f"s3://{d['bucket']}/{d['key']}"
        recorded = w.jobs.jobs_fn.module.runtime.service.store.checkpoints(uri)
        assert sorted(r.sequence for r in recorded) == [1, 2]

    @staticmethod
    def write(w: FaultWorld, uri: str, job_id: str, sequence: int) -> str:
        """Commit a checkpoint as the agent does (files, then MANIFEST.json); its manifest's URI."""
        bucket, prefix = uri.removeprefix("s3://").split("/", 1)
        s3 = w.jobs.stack.client("s3")
        body = b"weights" * sequence
        s3.put_object(Bucket=bucket, Key=f"{prefix}checkpoints/{sequence:010d}/model.pt", Body=body)
        manifest = {
            "format": 1,
            "sequence": sequence,
            "job_id": job_id,
            "attempt": 1,
            "step": sequence * 100,
            "progress": sequence / 10,
            "created_at": datetime.now(UTC).isoformat(),
            "files": [{"path": "model.pt", "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}],
        }
        key = f"{prefix}checkpoints/{sequence:010d}/MANIFEST.json"
        s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(manifest).encode())
        return f"s3://{bucket}/{key}"


PATHS: dict[str, Path] = {p.name: p for p in (InterruptionPath(), ResubmitPath(), CheckpointPath())}


def run_case(w: FaultWorld, path: Path, fault: Any | None) -> Case:
    """prepare, stimulus under `fault`, settle and reconcile; the end state is the caller's to check."""
    w.injector.reset(None)
    w.reset_time()
    w.purge_dead_letters()
    case = path.prepare(w)
    w.injector.reset(fault)
    path.stimulus(w, case)
    w.settle()
    w.injector.fault = None  # reconcile runs fault-free (what took effect is still recorded)
    if not path.done(w, case):  # what redelivery left undone is reconcile's (a launch left half-done)
        w.reconcile()
        w.settle()
    return case


def record_ops(w: FaultWorld, path: Path) -> list[Call]:
    """The calls a path's stimulus makes, fault-free (prepared twice: the second run is the one recorded,
    with every per-process cache as warm as in the cases)."""
    for attempt in range(2):
        w.injector.reset(None)
        w.reset_time()
        case = path.prepare(w)
        w.injector.reset(None)
        path.stimulus(w, case)
        w.settle()
        calls = w.injector.ops()
        path.check(w, case)
        path.cleanup(w, case)
        if attempt == 1:
            return calls
    raise AssertionError("unreachable")
