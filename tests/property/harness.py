"""The system the properties run against, and what they observe of it.

`PropertyWorld` is the stack over moto in this process (`make_jobs_world`) with, for the samples to
point at: a GPU host with two managed tasks (indexed), and a running job with a committed checkpoint.
`deliver` hands one SQS batch to a queue function as Lambda's event source mapping would and says, per
record, whether it failed, went to the dead-letter queue (with which reason) and which AWS calls it
made: every call SpotGuard makes is seen through a botocore `before-parameter-build` hook
(spotguard.adapters.clients.on_every_call) and put down to the record being handled.
"""

from __future__ import annotations

import contextvars
import copy
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.awsrequest import AWSResponse

from spotguard.adapters import clients
from spotguard.domain.own_events import LAUNCH_DUE, LIFECYCLE_CHECK, own_event
from spotguard_cli.emulator.gpucluster import Host
from spotguard_cli.emulator.inject import SAMPLES, container_instance_event
from spotguard_cli.emulator.lambdas import FunctionHost, QueuePoller
from spotguard_cli.emulator.world import JobsWorld, make_jobs_world

READS = ("Get", "List", "Describe", "Query", "Scan", "Head", "BatchGet")
SAMPLE_IDS = ("i-0b662ef9931388ba0", "i-0d1e2f3a4b5c6d7e8", "i-07c1ae5d2b8e6f301", "i-0c4e1f7a9b2d3e5f6")


def mutating(op: str) -> bool:
    return not op.startswith(READS)


@dataclass
class Outcome:
    """What became of one record of a batch."""

    message_id: str
    body: str
    failed: bool = False  # in batchItemFailures: SQS would deliver it again
    dead: str | None = None  # the reject reason it was dead-lettered with
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (operation, API parameters)

    @property
    def effects(self) -> list[str]:
        """Mutating calls other than the one that dead-letters the record."""
        return [op for op, params in self.calls if mutating(op) and not _is_dead_letter(op, params)]


def _is_dead_letter(op: str, params: dict[str, Any]) -> bool:
    return op == "SendMessage" and "spotguard-reject-reason" in (params.get("MessageAttributes") or {})


# the message id of the record being handled: per context, as the interruption function handles the
# records of a batch side by side (and its stops run in the context of their record)
_CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("spotguard_current", default=None)


@dataclass
class PropertyWorld:
    jobs: JobsWorld
    host: Host
    managed: list[str]
    job: dict[str, Any]
    job_item: dict[str, Any]
    samples: dict[str, dict[str, Any]]  # sample name -> the event, pointed at this world
    calls: list[tuple[str, dict[str, Any], str | None]] = field(default_factory=list)

    @classmethod
    def build(cls) -> PropertyWorld:
        jobs = make_jobs_world()
        world = cls(jobs=jobs, host=None, managed=[], job={}, job_item={}, samples={})  # type: ignore[arg-type]

        def lifecycle(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:  # moto has neither call
            return AWSResponse("local://autoscaling", 200, {}, None), {}

        clients.on_event("before-call.autoscaling.CompleteLifecycleAction", lifecycle)
        clients.on_event("before-call.autoscaling.RecordLifecycleActionHeartbeat", lifecycle)
        clients.on_every_call(world._record_call)
        for poller in world.pollers.values():
            world._attribute(poller.host)

        cluster = jobs.cluster
        world.host = cluster.add_host("g5.12xlarge", "us-east-1a")
        world.managed = cluster.start(world.host, cluster.gpu_task_definition(gpus=2), count=2)
        for arn in world.managed:  # their GPUs are taken: the scheduler places no job's task there
            jobs.scheduler.placed[arn], jobs.scheduler.gpus[arn] = world.host.container_instance_arn, 2
        world.send("interruptions", json.dumps(container_instance_event(cluster.describe_host(world.host))))

        world.job = jobs.submit(gpus=1)
        jobs.emit(world.job["task_arn"])
        world.commit(12)
        world.job_item = world._job_item()
        world.samples = world._samples()
        return world

    # ------------------------------------------------------------------------------------- parts
    @property
    def pollers(self) -> dict[str, QueuePoller]:
        j = self.jobs
        return {
            "interruptions": j.interruptions,
            "task-events": j.task_events,
            "checkpoints": j.checkpoints,
        }

    @property
    def bucket(self) -> str:
        return self.jobs.stack.outputs["CheckpointBucketName"]

    @property
    def ledger_table(self) -> str:
        return self.jobs.stack.functions["JobsFunction"].environment["SPOTGUARD_LEDGER_TABLE"]

    def checkpoint_key(self, sequence: int) -> str:
        prefix = self.job["checkpoint_uri"].removeprefix(f"s3://{self.bucket}/")
        return f"{prefix}checkpoints/{sequence:010d}/MANIFEST.json"

    def commit(self, sequence: int) -> None:
        """A committed checkpoint of the job, as the agent writes it (its event comes by itself)."""
        s3 = self.jobs.stack.client("s3")
        key = self.checkpoint_key(sequence)
        body = b"weights"
        s3.put_object(Bucket=self.bucket, Key=key.replace("MANIFEST.json", "model.pt"), Body=body)
        manifest = {
            "format": 1,
            "sequence": sequence,
            "job_id": self.job["job_id"],
            "attempt": 1,
            "step": 100 * sequence,
            "progress": 0.5,
            "created_at": datetime.now(UTC).isoformat(),
            "files": [{"path": "model.pt", "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}],
        }
        s3.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(manifest).encode())
        self.jobs.checkpoints.drain()

    # ---------------------------------------------------------------------------------- samples
    def _samples(self) -> dict[str, dict[str, Any]]:
        """Every sample in events/eventbridge (and SpotGuard's own two messages), pointed at this
        world's host, job, task and bucket, so that a record acted on acts for real."""
        out: dict[str, dict[str, Any]] = {}
        for path in sorted(SAMPLES.glob("*.json")):
            text = path.read_text()
            for sample_id in SAMPLE_IDS:
                text = text.replace(sample_id, self.host.instance_id)
            out[path.stem] = json.loads(text)
        ci = out["ecs-container-instance-state-change"]["detail"]
        ci["clusterArn"], ci["containerInstanceArn"] = self.jobs.cluster.arn, self.host.container_instance_arn
        task = self.jobs.task(self.job["task_arn"])
        td = out["ecs-task-state-change"]
        td["region"], td["resources"] = "us-east-1", [task["taskArn"]]
        td["detail"].update(
            clusterArn=task["clusterArn"],
            taskArn=task["taskArn"],
            containerInstanceArn=task["containerInstanceArn"],
            taskDefinitionArn=task["taskDefinitionArn"],
            startedBy=task["startedBy"],
        )
        for c in td["detail"]["containers"]:
            c["taskArn"] = task["taskArn"]
        s3 = out["s3-manifest-created"]["detail"]
        s3["bucket"]["name"], s3["object"]["key"] = self.bucket, self.checkpoint_key(12)
        now = datetime.now(UTC)
        out["lifecycle-check"] = json.loads(
            own_event(
                LIFECYCLE_CHECK,
                {
                    "instance-id": self.host.instance_id,
                    "lifecycle": {
                        "group": "gpu-spot-asg",
                        "hook": "spotguard-drain",
                        "token": "87654321-4321-4321-4321-210987654321",
                    },
                    "deadline": now.isoformat(),
                    "notice-key": "spot-interruption#1#" + self.host.instance_id,
                },
                now,
            )
        )
        out["launch-due"] = json.loads(
            own_event(LAUNCH_DUE, {"job-id": self.job["job_id"], "launch-try": 1}, now)
        )
        return out

    def sample(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.samples[name])

    # ----------------------------------------------------------------------------------- delivery
    def deliver(self, queue: str, bodies: list[str]) -> list[Outcome]:
        """One batch, as Lambda's SQS event source mapping hands it to the queue's function."""
        poller = self.pollers[queue]
        outcomes = [Outcome(str(uuid.uuid4()), b) for b in bodies]
        records = [
            {
                "messageId": o.message_id,
                "receiptHandle": "AQEB" + o.message_id,
                "body": o.body,
                "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1795275963000"},
                "messageAttributes": {},
                "md5OfBody": hashlib.md5(o.body.encode("utf-8", "surrogatepass")).hexdigest(),
                "eventSource": "aws:sqs",
                "eventSourceARN": poller.queue_arn,
                "awsRegion": "us-east-1",
            }
            for o in outcomes
        ]
        self.calls.clear()
        try:
            answer = poller.host.invoke({"Records": records})
            failed = {f["itemIdentifier"] for f in answer["batchItemFailures"]}
        except Exception as exc:  # Powertools raises when every record of the batch failed
            if type(exc).__name__ != "BatchProcessingError":
                raise
            failed = {o.message_id for o in outcomes}
        by_id = {o.message_id: o for o in outcomes}
        for op, params, current in self.calls:
            if current in by_id:
                by_id[current].calls.append((op, params))
                attrs = params.get("MessageAttributes") or {}
                if _is_dead_letter(op, params):
                    source = attrs["spotguard-source-message-id"]["StringValue"]
                    by_id[source].dead = attrs["spotguard-reject-reason"]["StringValue"]
        for o in outcomes:
            o.failed = o.message_id in failed
        return outcomes

    def send(self, queue: str, body: str) -> None:
        poller = self.pollers[queue]
        poller.sqs.send_message(QueueUrl=poller.queue_url, MessageBody=body)
        poller.drain()

    def invoke_jobs(self, payload: Any) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
        """The jobs function's answer to a payload, and the AWS calls it made."""
        self.calls.clear()
        token = _CURRENT.set("jobs")
        try:
            answer = self.jobs.invoke(payload)
        finally:
            _CURRENT.reset(token)
        return answer, [(op, params) for op, params, _ in self.calls]

    # ---------------------------------------------------------------------------------- isolation
    def restore(self) -> None:
        """Put the job back as it was after `build`, so that no example sees another's changes."""
        self.jobs.stack.client("dynamodb").put_item(TableName=self.ledger_table, Item=self.job_item)
        self.jobs.scheduler.gpus = dict.fromkeys(self.managed, 2)  # every GPU free again but the host's

    def _job_item(self) -> dict[str, Any]:
        key = {"pk": {"S": f"JOB#{self.job['job_id']}"}, "sk": {"S": "JOB"}}
        return dict(
            self.jobs.stack.client("dynamodb").get_item(
                TableName=self.ledger_table, Key=key, ConsistentRead=True
            )["Item"]
        )

    # ------------------------------------------------------------------------------------- hooks
    def _record_call(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        self.calls.append((model.name, params, _CURRENT.get()))

    def _attribute(self, host: FunctionHost) -> None:
        """Wrap the function's record handler so that every call it makes is put down to its record."""
        module = host.module
        inner = module.record_handler

        def record_handler(record: Any) -> Any:
            token = _CURRENT.set(record.message_id)
            try:
                return inner(record)
            finally:
                _CURRENT.reset(token)

        module.record_handler = record_handler
