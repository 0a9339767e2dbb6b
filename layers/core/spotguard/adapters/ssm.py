"""SSM Run Command: deliver a signal to a task's checkpoint container on its host.

Everything put into the shell command is checked against a strict pattern first and then quoted:
task ARNs and container names come from ECS, but a command line is no place to trust anything.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Any

from spotguard.domain.tasks import TaskInfo

SIGNALS = {"SIGUSR1", "SIGUSR2", "SIGTERM"}
_RUNTIME_ID = re.compile(r"^[0-9a-f]{12,64}$")
_TASK_ARN = re.compile(r"^arn:aws[\w-]*:ecs:[\w-]+:\d{12}:task/(?:[\w-]+/)?[0-9a-f-]{32,36}$")
_CONTAINER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


def signal_commands(tasks: Sequence[TaskInfo], signal: str) -> list[str]:
    """Shell lines that send `signal` to each task's checkpoint container (and to no other)."""
    if signal not in SIGNALS:
        raise ValueError(f"refusing to send {signal!r}")
    lines: list[str] = []
    for task in tasks:
        name = task.checkpoint_container
        if name is None or not _CONTAINER_NAME.match(name):
            raise ValueError(f"task {task.task_arn}: no valid checkpoint container name")
        runtime_id = dict(task.containers).get(name)
        if runtime_id and _RUNTIME_ID.match(runtime_id):
            lines.append(f"docker kill --signal={signal} {runtime_id}")
            continue
        if not _TASK_ARN.match(task.task_arn):
            raise ValueError(f"{task.task_arn!r} is not an ECS task ARN")
        # No runtime id in the description: find the container by the labels the ECS agent puts on it.
        lines.append(
            "docker ps -q"
            f" --filter label=com.amazonaws.ecs.task-arn={shlex.quote(task.task_arn)}"
            f" --filter label=com.amazonaws.ecs.container-name={shlex.quote(name)}"
            f" | xargs -r docker kill --signal={signal}"
        )
    return lines


class SsmSignaller:
    def __init__(self, client: Any) -> None:
        self.client = client

    def signal(self, instance_id: str, tasks: Sequence[TaskInfo], signal: str) -> str:
        """One Run Command for all of the host's tasks: one call, whatever their number."""
        resp = self.client.send_command(
            InstanceIds=[instance_id],
            DocumentName="AWS-RunShellScript",
            Comment=f"SpotGuard: {signal} to {len(tasks)} task(s)"[:100],
            Parameters={"commands": signal_commands(tasks, signal)},
            TimeoutSeconds=60,
        )
        return str(resp["Command"]["CommandId"])
