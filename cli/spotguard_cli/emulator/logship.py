"""The awslogs log driver of the local stack: each task's output, which the runner writes to a file, put
into CloudWatch Logs (moto's) under the group and stream its task definition names, as ECS's awslogs
driver does: stream `prefix/container/task-id`. So `spotguard jobs logs` reads a local job's logs as it
reads them on AWS.

Only tasks whose first container has an awslogs configuration are shipped (the demos' task definitions
have none: their logs stay in .local-stack only). `ship()` does one round: new lines of every task seen,
running or ended (a file read to its end after its task ended is done with).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_BATCH = 1000  # events per PutLogEvents (CloudWatch's limit is 10,000)


@dataclass
class _Shipped:
    path: Path
    group: str
    stream: str
    offset: int = 0
    ended: bool = False


class LogShipper:
    """`runner`: the local system's TaskRunner (its `running` tasks and their log files); `logs`: a
    CloudWatch Logs client of the local stack."""

    def __init__(self, runner: Any, logs: Any) -> None:
        self.runner, self.logs = runner, logs
        self.tasks: dict[str, _Shipped] = {}
        self.unshipped: set[str] = set()  # tasks without awslogs: asked about once
        self._groups: set[str] = set()

    def ship(self) -> int:
        """One round; the events put."""
        for arn, r in list(self.runner.running.items()):
            if arn not in self.tasks and arn not in self.unshipped:
                found = self._destination(arn, r)
                if found is None:
                    self.unshipped.add(arn)
                else:
                    self.tasks[arn] = found
        for arn, t in self.tasks.items():
            if arn not in self.runner.running:
                t.ended = True
        return sum(self._ship(t) for t in self.tasks.values() if not (t.ended and t.offset < 0))

    def _destination(self, arn: str, r: Any) -> _Shipped | None:
        ecs = self.runner.ecs
        task = ecs.describe_tasks(cluster=self.runner.cluster.name, tasks=[arn])["tasks"][0]
        td = ecs.describe_task_definition(taskDefinition=task["taskDefinitionArn"])["taskDefinition"]
        container = td["containerDefinitions"][0]
        conf = container.get("logConfiguration") or {}
        options = conf.get("options") or {}
        if conf.get("logDriver") != "awslogs" or "awslogs-group" not in options:
            return None
        prefix = options.get("awslogs-stream-prefix")
        task_id = arn.rsplit("/", 1)[-1]
        stream = f"{prefix}/{container['name']}/{task_id}" if prefix else r.runtime_id
        group = str(options["awslogs-group"])
        if group not in self._groups:
            with contextlib.suppress(self.logs.exceptions.ResourceAlreadyExistsException):
                self.logs.create_log_group(logGroupName=group)
            self._groups.add(group)
        self.logs.create_log_stream(logGroupName=group, logStreamName=stream)
        return _Shipped(Path(r.log_path), group, stream)

    def _ship(self, t: _Shipped) -> int:
        if not t.path.exists():
            return 0
        with t.path.open("rb") as f:
            f.seek(t.offset)
            data = f.read()
        # whole lines only, but everything once the task has ended
        end = len(data) if t.ended else data.rfind(b"\n") + 1
        if end <= 0:
            if t.ended:
                t.offset = -1  # done with it
            return 0
        lines = data[:end].decode(errors="replace").splitlines()
        t.offset += end
        now = int(time.time() * 1000)
        events = [{"timestamp": now, "message": line} for line in lines if line]
        for i in range(0, len(events), MAX_BATCH):
            self.logs.put_log_events(
                logGroupName=t.group, logStreamName=t.stream, logEvents=events[i : i + MAX_BATCH]
            )
        if t.ended:
            t.offset = -1
        return len(events)
