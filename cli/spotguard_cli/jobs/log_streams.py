"""Where an attempt's container logs are: the CloudWatch Logs streams of its tasks, found through ECS.

Its task's task definition (DescribeTasks gives the task's own revision; a task ECS no longer knows,
stopped more than about an hour ago, is read through the job request's task definition) names each
container's awslogs group and stream prefix, and the stream is `prefix/container/task-id` (without a
prefix, ECS on EC2 names it after the Docker container's id, the task's `runtimeId`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from spotguard_cli.answers import AttemptView, NodeView, RequestView

ClientFactory = Callable[[str, "str | None"], Any]  # (service, region or None) -> a boto3 client


class Fatal(Exception):
    """An error no later attempt or poll would get past (no credentials, no endpoint): one line, exit 1."""


@dataclass(frozen=True)
class Stream:
    container: str
    group: str
    name: str
    region: str | None
    node: int | None = None  # a multi-node job's node whose task this is (None: a one-node job's)


@dataclass
class AttemptLogs:
    """Where one attempt's logs are, and what could not be found (said in `notes`, a line each)."""

    number: int
    task_arn: str
    tasks: tuple[str, ...] = ()  # every task resolved (a gang's nodes): one launched later is resolved again
    streams: list[Stream] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pending: bool = False  # a stream named after a container not started yet: resolved again later
    failed: bool = False  # an AWS error, not a configuration without awslogs


def task_id(arn: str) -> str:
    return arn.rsplit("/", 1)[-1]


def _arn_region(arn: str) -> str | None:
    parts = arn.split(":")
    return parts[3] or None if len(parts) > 5 and parts[0] == "arn" else None


def _has_revision(td: str) -> bool:
    return bool(re.search(r":\d+$", td))


def aws_error(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        return f"{err.get('Code', type(exc).__name__)}: {err.get('Message', '')}".strip()
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def fatal_if_unreachable(exc: Exception) -> None:
    from botocore.exceptions import BotoCoreError

    if isinstance(exc, BotoCoreError):
        raise Fatal(aws_error(exc)) from exc


class Resolver:
    """Finds the streams of a job's attempts: DescribeTasks (batched, cached), DescribeTaskDefinition
    (cached per revision)."""

    def __init__(self, aws: ClientFactory, request: RequestView) -> None:
        self.aws = aws
        self.cluster = request.cluster or "default"
        self.request_td = request.taskDefinition
        self._tasks: dict[str, dict[str, Any]] = {}
        self._described: set[str] = set()
        self._tds: dict[str, dict[str, Any]] = {}

    def describe(self, arns: Iterable[str], again: bool = False) -> None:
        todo = [a for a in dict.fromkeys(arns) if again or a not in self._described]
        for region in {_arn_region(a) for a in todo}:
            batch = [a for a in todo if _arn_region(a) == region]
            ecs = self.aws("ecs", region)
            for i in range(0, len(batch), 100):
                try:
                    answer = ecs.describe_tasks(cluster=self.cluster, tasks=batch[i : i + 100])
                except Exception as exc:  # a task not described is read via the request
                    fatal_if_unreachable(exc)
                    continue
                for t in answer.get("tasks", []):
                    self._tasks[t["taskArn"]] = t
                self._described.update(batch[i : i + 100])

    def _task_definition(self, ref: str, region: str | None) -> dict[str, Any]:
        if ref not in self._tds:
            ecs = self.aws("ecs", region)
            self._tds[ref] = ecs.describe_task_definition(taskDefinition=ref)["taskDefinition"]
        return self._tds[ref]

    def resolve(self, attempt: AttemptView, node: int | None = None) -> AttemptLogs:
        """The attempt's streams: its task's, or every node's of a multi-node job (`node`: that one's
        alone), each stream named by its node."""
        found = AttemptLogs(number=attempt.number, task_arn=attempt.task_arn)
        tasks = [t for t in attempt.tasks if node is None or t.node == node]
        found.tasks = tuple(t.task_arn for t in tasks)
        self.describe(found.tasks, again=attempt.live)
        for t in tasks:
            self._resolve_task(found, t, attempt.gang, attempt.live)
        if attempt.folded_peers and node != 0:
            # an old gang: the ledger keeps node 0's record alone, so the others' streams are not known
            found.notes.append(
                f"attempt {attempt.number}: the records of its other {attempt.folded_peers} node(s) were "
                "folded (an old gang's): their logs cannot be found"
            )
        elif node is not None and not tasks:
            forming = attempt.live and not attempt.abandoned
            launched = "is not launched yet" if forming else "was never launched"
            found.notes.append(f"attempt {attempt.number}: node {node} {launched}")
            found.pending = forming
        return found

    def _resolve_task(self, found: AttemptLogs, node_task: NodeView, gang: bool, live: bool) -> None:
        """One task's streams into `found`. A note about the task definition is said once for the
        attempt (a gang's nodes run the same one); one about the task names its node."""
        n, arn, node = found.number, node_task.task_arn, node_task.node
        who = f"attempt {n} node {node}" if gang else f"attempt {n}"
        task = self._tasks.get(arn)
        ref = str(task["taskDefinitionArn"]) if task else self.request_td
        region = _arn_region(arn)
        notes: list[str] = []
        try:
            td = self._task_definition(ref, region)
        except Exception as exc:  # said in one line; the other attempts go on
            fatal_if_unreachable(exc)
            notes.append(f"attempt {n}: task definition {ref} could not be read: {aws_error(exc)}")
            found.failed = True
            _add_notes(found, notes)
            return
        if task is None and not _has_revision(ref):
            notes.append(
                f"{who}: task {task_id(arn)} is no longer known to ECS; reading it through "
                f"{ref}'s latest revision (the attempt may have run an older one)"
            )
        runtime_ids = {str(c.get("name")): c.get("runtimeId") for c in (task or {}).get("containers") or []}
        elsewhere: list[str] = []
        unnamed: list[str] = []  # awslogs without a stream prefix, and no container id known yet
        streams: list[Stream] = []
        pending = False
        for c in td.get("containerDefinitions") or []:
            name = str(c.get("name"))
            conf = c.get("logConfiguration") or {}
            options = conf.get("options") or {}
            if conf.get("logDriver") != "awslogs" or not options.get("awslogs-group"):
                elsewhere.append(f"{name} ({conf.get('logDriver') or 'no log driver'})")
                continue
            prefix = options.get("awslogs-stream-prefix")
            if prefix:
                stream = f"{prefix}/{name}/{task_id(arn)}"
            elif runtime_ids.get(name):
                stream = str(runtime_ids[name])
            else:
                pending = True
                unnamed.append(name)
                continue
            streams.append(
                Stream(
                    name,
                    str(options["awslogs-group"]),
                    stream,
                    options.get("awslogs-region") or region,
                    node if gang else None,
                )
            )
        if elsewhere:
            what = "no container" if not streams and not pending else "not every container"
            notes.append(
                f"attempt {n}: {what} of {td.get('family', ref)}:{td.get('revision', '?')} logs to "
                f"CloudWatch Logs with awslogs ({', '.join(elsewhere)}): nothing to show for "
                f"{'it' if len(elsewhere) == 1 else 'them'}"
            )
        if pending and not live:
            notes.append(
                f"{who}: {', '.join(unnamed)}: awslogs without a stream prefix, and ECS no longer "
                "knows the container ids that name those streams"
            )
            pending = False
        found.streams += streams
        found.pending |= pending
        _add_notes(found, notes)


def _add_notes(found: AttemptLogs, notes: list[str]) -> None:
    found.notes += [note for note in notes if note not in found.notes]
