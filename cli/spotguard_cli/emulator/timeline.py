"""A timeline of what happened, in seconds since a moment (the warning), for the local demo; and a
botocore hook that writes SpotGuard's own AWS calls into it (drain, RunTask, StopTask, SSM, commits)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any


class Timeline:
    """What happened, in order; shown as seconds since the warning (negative = set-up before it)."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self._rows: list[tuple[float, str]] = []

    def mark_zero(self) -> None:
        self.t0 = time.monotonic()

    def add(self, what: str) -> None:
        self._rows.append((time.monotonic(), what))

    @property
    def rows(self) -> list[tuple[float, str]]:
        zero = self.t0 if self.t0 is not None else (self._rows[0][0] if self._rows else 0.0)
        return [(t - zero, w) for t, w in self._rows]


def call_recorder(timeline: Timeline, calls: list[str]) -> Callable[..., None]:
    interesting = {"UpdateContainerInstancesState", "StopTask", "SendCommand", "CompleteLifecycleAction"}

    def hook(model: Any, params: dict[str, Any], **_: Any) -> None:
        calls.append(model.name)
        if model.name == "RunTask":
            env = {
                e["name"]: e["value"]
                for c in (params.get("overrides") or {}).get("containerOverrides") or []
                for e in c.get("environment") or []
            }
            resume = env.get("SPOTGUARD_RESUME_FROM") or "scratch"
            timeline.add(f"  RunTask attempt {env.get('SPOTGUARD_ATTEMPT', '?')} from {resume}")
        elif model.name == "PutItem" and params.get("Item", {}).get("sk", {}).get("S") == "NEWEST":
            ref = json.loads(params["Item"]["ref"]["S"])
            timeline.add(
                f"  checkpoint {ref['sequence']} committed (step {ref['step']}, attempt {ref['attempt']})"
            )
        elif model.name == "StopTask":
            timeline.add(
                f"  StopTask {params['task'].rsplit('/', 1)[-1][:8]}…  reason: {params.get('reason')}"
            )
        elif model.name == "UpdateContainerInstancesState":
            timeline.add(
                f"  drain {params['containerInstances'][0].rsplit('/', 1)[-1][:8]}… -> {params['status']}"
            )
        elif model.name == "SendCommand":
            p = params.get("Parameters", {})
            what = f"{(p.get('signal') or [''])[0]} to {' '.join(p.get('containerIds') or [])}".strip()
            timeline.add(f"  SSM Run Command on {params['InstanceIds'][0]}: {what}")
        elif model.name in interesting:
            timeline.add(f"  {model.name}")

    return hook
