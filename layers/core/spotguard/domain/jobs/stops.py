"""Why did a task stop, and what does that mean for its job? Pure.

A stopped task is classified from its exit codes, `stopCode` (older events carry none), `stoppedReason`
and SpotGuard's own record of having stopped it for a notice or a cancel:

- succeeded: the checkpoint container exited 0 (docs/container-contract.md: 0 = the job finished);
- resubmit:  exit 75 (stopped after committing a checkpoint), exit 69 (the agent could not read a committed
             checkpoint now), stopped by SpotGuard for a notice, the host going away, or ECS's own
             SpotInterruption / TerminationNotice;
- cancelled: stopped by SpotGuard because the user cancelled the job;
- failed:    anything else (the job's own failure; its error retries are the state machine's business).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

RESUME_ME = 75
# The agent found a committed checkpoint it cannot read now (throttled, S3 down, access denied): nothing
# is lost, so the job is tried again (an attempt of its max_attempts), never started from scratch.
CHECKPOINT_UNAVAILABLE = 69  # EX_UNAVAILABLE
SPOTGUARD_REASON = "SpotGuard: "
CANCEL_REASON = "SpotGuard: cancelled"
# Reconcile found a job's task gone from ECS (which forgets stopped tasks after about an hour) without
# ever seeing it stop: its exit is unknown, so it is resumed from its checkpoint rather than lost.
VANISHED_REASON = "SpotGuard: vanished from ECS before its stop was seen"
_HOST_GONE = re.compile(
    r"(Host EC2 \(instance i-[0-9a-f]+\) (terminated|stopped|shutting-down))"
    r"|(EC2 instance i-[0-9a-f]+ (was )?(terminated|stopped))",
    re.IGNORECASE,
)
_INTERRUPTION_CODES = {"SpotInterruption", "TerminationNotice"}

Outcome = Literal["succeeded", "resubmit", "cancelled", "failed"]


class StopVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)
    outcome: Outcome
    reason: str
    exit_code: int | None = None


class OwnRecord(BaseModel):
    """What SpotGuard itself did to the task (from its ledger): None of these = nothing."""

    model_config = ConfigDict(frozen=True)
    stopped_for_notice: str | None = None  # the notice key
    cancelled: bool = False


def _main_exit(containers: Sequence[Mapping[str, Any]], checkpoint_container: str | None) -> int | None:
    chosen = next((c for c in containers if c.get("name") == checkpoint_container), None)
    if chosen is None and containers:
        chosen = containers[0]
    code = None if chosen is None else chosen.get("exitCode")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def classify_stop(
    detail: Mapping[str, Any], own: OwnRecord | None = None, checkpoint_container: str | None = None
) -> StopVerdict:
    """`detail` is an ECS Task State Change event's detail (or a DescribeTasks task) with lastStatus
    STOPPED."""
    own = own or OwnRecord()
    containers = [c for c in detail.get("containers") or [] if isinstance(c, Mapping)]
    code = _main_exit(containers, checkpoint_container)
    stop_code = detail.get("stopCode")  # absent in older events
    reason = str(detail.get("stoppedReason") or "")

    if code == 0:
        return StopVerdict(outcome="succeeded", reason="the job's container exited 0", exit_code=code)
    if own.cancelled or reason.startswith(CANCEL_REASON):
        return StopVerdict(
            outcome="cancelled", reason="cancelled by the user through SpotGuard", exit_code=code
        )
    if reason.startswith(VANISHED_REASON):
        return StopVerdict(outcome="resubmit", reason="the task vanished from ECS before its stop was seen")
    if code == CHECKPOINT_UNAVAILABLE:
        return StopVerdict(
            outcome="resubmit",
            reason="exit 69: its committed checkpoint could not be read now; trying again",
            exit_code=code,
        )
    if code == RESUME_ME:
        return StopVerdict(
            outcome="resubmit", reason="exit 75: stopped after committing a checkpoint", exit_code=code
        )
    if own.stopped_for_notice or reason.startswith(SPOTGUARD_REASON):
        why = own.stopped_for_notice or reason.removeprefix(SPOTGUARD_REASON)
        return StopVerdict(outcome="resubmit", reason=f"stopped by SpotGuard for {why}", exit_code=code)
    if stop_code in _INTERRUPTION_CODES:
        return StopVerdict(outcome="resubmit", reason=f"ECS stopCode {stop_code}", exit_code=code)
    if _HOST_GONE.search(reason) or any(_HOST_GONE.search(str(c.get("reason") or "")) for c in containers):
        return StopVerdict(outcome="resubmit", reason=f"the host went away: {reason[:200]}", exit_code=code)
    what = f"exit {code}" if code is not None else "no exit code"
    detail_text = (
        f"{stop_code or 'no stopCode'}: {reason[:200]}" if reason or stop_code else "no reason given"
    )
    return StopVerdict(outcome="failed", reason=f"{what} ({detail_text})", exit_code=code)
