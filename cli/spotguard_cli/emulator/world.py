"""`JobsWorld`: the system assembled over moto in this process, for the tests and the jobs benchmark.

Every function's handler runs in this process, ECS's placement is played by a GpuScheduler, and ECS's
task events by `emit` (moto emits none), delivered through EventBridge's rules as in AWS. Nothing runs
by itself: each test delivers what it wants, when it wants.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from spotguard.domain import clock
from spotguard_cli.emulator.assembly import assemble
from spotguard_cli.emulator.gpucluster import GpuCluster, Host
from spotguard_cli.emulator.gpuscheduler import GpuScheduler
from spotguard_cli.emulator.inject import make_event, put_entry, task_event
from spotguard_cli.emulator.lambdas import FunctionHost, QueuePoller
from spotguard_cli.emulator.stack import DeployedStack


@dataclass
class JobsWorld:
    """The whole stack's functions over moto: ECS's placement played by a GpuScheduler, and ECS's task
    events played by `emit` (moto emits none), delivered through EventBridge as in AWS."""

    stack: DeployedStack
    cluster: GpuCluster
    hosts: dict[str, Host]
    scheduler: GpuScheduler
    jobs_fn: FunctionHost
    interruptions: QueuePoller
    task_events: QueuePoller
    retries: QueuePoller
    checkpoints: QueuePoller
    versions: dict[str, int]
    notifications_url: str | None  # None: not caught (make_jobs_world's `caught`)
    job_events_url: str | None
    reconcile_fn: FunctionHost
    hosts_of_functions: list[FunctionHost]
    pollers: list[QueuePoller]  # every queue's, in the template's order
    functions: dict[str, FunctionHost]  # logical id -> the handler

    def reconcile(self) -> dict[str, int]:
        """What the schedule does every 5 minutes."""
        return dict(self.reconcile_fn.invoke({"id": "local-schedule", "source": "aws.scheduler"}))

    def shift_clock(self, seconds: float) -> None:
        """Make every function's clock run `seconds` ahead (time passing, without waiting for it)."""
        for host in self.hosts_of_functions:
            host.module.runtime.clock = lambda: datetime.now(UTC) + timedelta(seconds=seconds)

    def invoke(self, payload: Any) -> dict[str, Any]:
        return dict(self.jobs_fn.invoke(payload))

    def submit(self, gpus: int = 1, **options: Any) -> dict[str, Any]:
        # a multi-node job's nodes reach each other at their instances' addresses: host networking
        mode = "host" if options.get("nodes", 1) > 1 else None
        td = self.cluster.gpu_task_definition(gpus=gpus, network_mode=mode)
        answer = self.invoke(
            {
                "action": "submit",
                "request": {"cluster": "gpu-spot", "taskDefinition": td, "launchType": "EC2"},
                "options": options,
            }
        )
        assert answer["ok"], answer
        return answer["job"]

    def status(self, job_id: str) -> dict[str, Any]:
        answer = self.invoke({"action": "status", "job_id": job_id})
        assert answer["ok"], answer
        return answer["job"]

    def task(self, arn: str) -> dict[str, Any]:
        return self.cluster.tasks([arn])[arn]

    def event(self, arn: str, exit_code: int | None = None, stop_code: str | None = None) -> dict[str, Any]:
        """The next task event ECS would emit for the task as it is now."""
        self.versions[arn] = self.versions.get(arn, 1) + 1
        return task_event(self.task(arn), self.versions[arn], exit_code=exit_code, stop_code=stop_code)

    def put(self, *events: dict[str, Any]) -> None:
        """Through EventBridge's rules, as AWS delivers them."""
        events_client = self.stack.client("events")
        for e in events:
            resp = events_client.put_events(Entries=[put_entry(e)])
            assert resp["FailedEntryCount"] == 0

    def emit(self, arn: str, exit_code: int | None = None, stop_code: str | None = None) -> dict[str, Any]:
        e = self.event(arn, exit_code, stop_code)
        self.put(e)
        self.task_events.drain()
        return e

    def stop(
        self, arn: str, reason: str = "Essential container in task exited", exit_code: int | None = None
    ) -> None:
        """StopTask; with `exit_code`, the containers' exit code as DescribeTasks will report it (moto
        reports 0 for every container otherwise; in-process moto only)."""
        self.stack.client("ecs").stop_task(cluster="gpu-spot", task=arn, reason=reason)
        self.scheduler.release(arn)
        if exit_code is not None and self.stack.endpoint is None:
            from moto.ecs.models import ecs_backends

            task = ecs_backends[self.stack.account][self.stack.region].tasks["gpu-spot"][arn]
            for c in task.containers:
                c.exitCode = exit_code

    def interrupt(self, host: Host) -> None:
        self.interruptions.sqs.send_message(
            QueueUrl=self.interruptions.queue_url,
            MessageBody=json.dumps(make_event("spot-interruption", host.instance_id)),
        )
        self.interruptions.drain()

    def commit_checkpoint(
        self,
        job: dict[str, Any],
        sequence: int,
        attempt: int = 1,
        progress: float | None = None,
        at: datetime | None = None,
        step: int | None = None,
    ) -> str:
        """Write a committed checkpoint as the agent does, and deliver its manifest event. `progress`
        defaults to sequence / 10, `step` to sequence x 100; `at` (the manifest's time) to now, or pass
        the shifted clock's now."""
        bucket, prefix = job["checkpoint_uri"].removeprefix("s3://").split("/", 1)
        s3 = self.stack.client("s3")
        body = b"weights" * sequence
        key = f"{prefix}checkpoints/{sequence:08d}/model.pt"
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        manifest = {
            "format": 1,
            "sequence": sequence,
            "job_id": job["job_id"],
            "attempt": attempt,
            "step": sequence * 100 if step is None else step,
            "progress": min(1.0, sequence / 10) if progress is None else progress,
            "created_at": (at or clock.now()).isoformat(),
            "files": [{"path": "model.pt", "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}],
        }
        mkey = f"{prefix}checkpoints/{sequence:08d}/MANIFEST.json"
        s3.put_object(Bucket=bucket, Key=mkey, Body=json.dumps(manifest).encode())
        event = make_event("checkpoint-manifest", "i-00000000")
        event["detail"]["bucket"]["name"] = bucket
        event["detail"]["object"]["key"] = mkey
        self.checkpoints.sqs.send_message(QueueUrl=self.checkpoints.queue_url, MessageBody=json.dumps(event))
        self.checkpoints.drain()
        return f"s3://{bucket}/{mkey}"

    def received(self, url: str) -> list[dict[str, Any]]:
        out = []
        while True:
            msgs = self.interruptions.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get(
                "Messages", []
            )
            if not msgs:
                return out
            out += [json.loads(m["Body"]) for m in msgs]
            for m in msgs:
                self.interruptions.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])

    def notifications(self) -> list[dict[str, Any]]:
        """What reached the SNS topic (an SQS subscriber stands in for the e-mail)."""
        return [json.loads(n["Message"]) for n in self.received(_caught(self.notifications_url))]

    def job_events(self) -> list[dict[str, Any]]:
        """SpotGuard's own EventBridge events (a rule on source spotguard to SQS stands in for users)."""
        return self.received(_caught(self.job_events_url))


def _caught(url: str | None) -> str:
    if url is None:
        raise RuntimeError("this world does not catch notifications (make_jobs_world(caught=False))")
    return url


def make_jobs_world(
    env: dict[str, str] | None = None,
    log: TextIO | None = None,
    parameters: dict[str, str] | None = None,
    hosts: bool = True,
    caught: bool = True,
) -> JobsWorld:
    """The system assembled in moto in this process (call it under `mock_aws`), six GPU hosts (1, 4 and 8
    GPUs in two zones; none with `hosts` False), and the notifications and SpotGuard's own events caught
    in SQS queues (not with `caught` False: a long run that never reads them would pile them up, and
    moto counts a queue's every message at each send to it). `parameters`: the stack's, beside the
    defaults."""
    shared = {"SPOTGUARD_RETRY_BASE_SECONDS": "1", "SPOTGUARD_LIFECYCLE_CHECK_SECONDS": "0", **(env or {})}
    parts = assemble(None, {"NotificationEmail": "", **(parameters or {})}, shared, log=log)
    stack, cluster = parts.stack, parts.cluster
    kinds = {
        "a1": ("g5.xlarge", "us-east-1a"),
        "b1": ("g5.xlarge", "us-east-1b"),
        "a4": ("g5.12xlarge", "us-east-1a"),
        "b4": ("g5.12xlarge", "us-east-1b"),
        "a8": ("g5.48xlarge", "us-east-1a"),
        "b8": ("g5.48xlarge", "us-east-1b"),
    }
    made = {name: cluster.add_host(itype, zone) for name, (itype, zone) in kinds.items()} if hosts else {}
    fns = parts.functions

    notes_url, job_events_url = _catch(stack) if caught else (None, None)
    return JobsWorld(
        stack=stack,
        cluster=cluster,
        hosts=made,
        scheduler=parts.scheduler,
        jobs_fn=fns["JobsFunction"],
        interruptions=parts.poller("InterruptionFunction"),
        task_events=parts.poller("TaskEventsFunction", "TaskEventsQueue"),
        retries=parts.poller("TaskEventsFunction", "LaunchRetry"),
        checkpoints=parts.poller("CheckpointsFunction"),
        versions={},
        notifications_url=notes_url,
        job_events_url=job_events_url,
        reconcile_fn=fns["ReconcileFunction"],
        hosts_of_functions=[fns["TaskEventsFunction"], fns["JobsFunction"], fns["ReconcileFunction"]],
        pollers=parts.pollers,
        functions=fns,
    )


def _catch(stack: DeployedStack) -> tuple[str, str]:
    """Queues that catch the topic's notifications and SpotGuard's EventBridge events, for tests to read."""
    sqs, sns, events = stack.client("sqs"), stack.client("sns"), stack.client("events")
    notes_url = sqs.create_queue(QueueName="test-notifications")["QueueUrl"]
    notes_arn = sqs.get_queue_attributes(QueueUrl=notes_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(TopicArn=stack.outputs["NotificationsTopicArn"], Protocol="sqs", Endpoint=notes_arn)
    job_events_url = sqs.create_queue(QueueName="test-job-events")["QueueUrl"]
    job_events_arn = sqs.get_queue_attributes(QueueUrl=job_events_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    events.put_rule(Name="test-job-events", EventPattern=json.dumps({"source": ["spotguard"]}))
    events.put_targets(Rule="test-job-events", Targets=[{"Id": "q", "Arn": job_events_arn}])
    return notes_url, job_events_url
