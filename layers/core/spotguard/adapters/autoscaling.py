"""Auto Scaling lifecycle hooks: keep a terminating instance alive while its tasks stop, then let it go."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from spotguard.domain.notices import LifecycleRef


def _unless_gone(call: Callable[..., Any], **params: Any) -> None:
    """Make the call; an action completed already (a repeated notice) or timed out leaves nothing to
    heartbeat or complete, which is not an error."""
    try:
        call(**params)
    except ClientError as exc:
        err = exc.response.get("Error", {})
        gone = err.get("Code") == "ValidationError" and "No active Lifecycle Action" in err.get("Message", "")
        if not gone:
            raise


class LifecycleAdapter:
    def __init__(self, client: Any) -> None:
        self.client = client

    @staticmethod
    def _action(ref: LifecycleRef, instance_id: str) -> dict[str, str]:
        return {
            "LifecycleHookName": ref.hook,
            "AutoScalingGroupName": ref.group,
            "LifecycleActionToken": ref.token,
            "InstanceId": instance_id,
        }

    def heartbeat(self, ref: LifecycleRef, instance_id: str) -> None:
        _unless_gone(self.client.record_lifecycle_action_heartbeat, **self._action(ref, instance_id))

    def complete(self, ref: LifecycleRef, instance_id: str) -> None:
        _unless_gone(
            self.client.complete_lifecycle_action,
            LifecycleActionResult="CONTINUE",
            **self._action(ref, instance_id),
        )
