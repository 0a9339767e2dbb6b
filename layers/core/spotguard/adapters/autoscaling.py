"""Auto Scaling lifecycle hooks: keep a terminating instance alive while its tasks stop, then let it go."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from spotguard.domain.notices import LifecycleRef


def _gone(exc: ClientError) -> bool:
    # Completed already (a repeated notice) or timed out: there is nothing left to heartbeat or complete.
    err = exc.response.get("Error", {})
    return err.get("Code") == "ValidationError" and "No active Lifecycle Action" in err.get("Message", "")


class LifecycleAdapter:
    def __init__(self, client: Any) -> None:
        self.client = client

    def heartbeat(self, ref: LifecycleRef, instance_id: str) -> None:
        try:
            self.client.record_lifecycle_action_heartbeat(
                LifecycleHookName=ref.hook,
                AutoScalingGroupName=ref.group,
                LifecycleActionToken=ref.token,
                InstanceId=instance_id,
            )
        except ClientError as exc:
            if not _gone(exc):
                raise

    def complete(self, ref: LifecycleRef, instance_id: str) -> None:
        try:
            self.client.complete_lifecycle_action(
                LifecycleHookName=ref.hook,
                AutoScalingGroupName=ref.group,
                LifecycleActionToken=ref.token,
                LifecycleActionResult="CONTINUE",
                InstanceId=instance_id,
            )
        except ClientError as exc:
            if not _gone(exc):
                raise
