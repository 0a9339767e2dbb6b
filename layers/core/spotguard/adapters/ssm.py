"""SSM Run Command: deliver a signal to tasks' checkpoint containers on their host, through SpotGuard's
own SSM document (template.yaml's `SignalDocument`, its name in SPOTGUARD_SIGNAL_DOCUMENT), which runs
`docker kill --signal` and nothing else; the interruption function's role may send no other document.

Its parameters: a signal, the checkpoint containers' runtime ids, and `<task ARN>=<container name>` pairs
for containers whose runtime id ECS did not report (the document finds those by the labels the ECS agent
puts on them). Each value is checked here as the document's allowedPattern checks it again in SSM (a
test holds the two together), so a bad one fails before any call, with the task it came from.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from spotguard.domain.tasks import TaskInfo

SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM")
MAX_PER_PARAMETER = 50  # the document's patterns take up to 50 ids, and up to 50 pairs
_RUNTIME_ID = re.compile(r"[0-9a-f]{12,64}")
_TASK_ARN = re.compile(r"arn:aws[a-z-]*:ecs:[a-z0-9-]+:[0-9]{12}:task/(?:[A-Za-z0-9_-]+/)?[0-9a-f-]{32,36}")
_CONTAINER_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")


def signal_document_parameters(tasks: Sequence[TaskInfo], signal: str) -> dict[str, list[str]]:
    """SendCommand's `Parameters` for the document: `signal` to each task's checkpoint container only."""
    if signal not in SIGNALS:
        raise ValueError(f"refusing to send {signal!r}")
    ids: list[str] = []
    pairs: list[str] = []
    for task in tasks:
        name = task.checkpoint_container
        if name is None or not _CONTAINER_NAME.fullmatch(name):
            raise ValueError(f"task {task.task_arn}: no valid checkpoint container name")
        runtime_id = dict(task.containers).get(name)
        if runtime_id and _RUNTIME_ID.fullmatch(runtime_id):
            ids.append(runtime_id)
        elif _TASK_ARN.fullmatch(task.task_arn):
            pairs.append(f"{task.task_arn}={name}")
        else:
            raise ValueError(f"{task.task_arn!r} is not an ECS task ARN")
    if len(ids) > MAX_PER_PARAMETER or len(pairs) > MAX_PER_PARAMETER:
        raise ValueError(f"more than {MAX_PER_PARAMETER} containers in one command: split the tasks")
    return {"signal": [signal], "containerIds": [" ".join(ids)], "taskContainers": [" ".join(pairs)]}


class SsmSignaller:
    def __init__(self, client: Any, document: str) -> None:
        self.client = client
        self.document = document

    def signal(self, instance_id: str, tasks: Sequence[TaskInfo], signal: str) -> str:
        """One Run Command per 50 of the host's tasks (the document's limit): one call for any real
        host. Returns the command ids, comma-separated."""
        ids = []
        for i in range(0, len(tasks), MAX_PER_PARAMETER):
            chunk = tasks[i : i + MAX_PER_PARAMETER]
            resp = self.client.send_command(
                InstanceIds=[instance_id],
                DocumentName=self.document,
                Comment=f"SpotGuard: {signal} to {len(chunk)} task(s)"[:100],
                Parameters=signal_document_parameters(chunk, signal),
                TimeoutSeconds=60,
            )
            ids.append(str(resp["Command"]["CommandId"]))
        return ",".join(ids)
