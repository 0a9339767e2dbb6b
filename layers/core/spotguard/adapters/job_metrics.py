"""The jobs path's metrics, in CloudWatch EMF like the rest (namespace `NAMESPACE`, the `service`
dimension from POWERTOOLS_SERVICE_NAME). The stack's dashboard reads them (docs/observability.md).

A module of its own, not `spotguard.adapters.metrics`: the interruption function imports that one, and
must not load the jobs domain at cold start.

- `JobEvents` (kind): every job notification as it goes out (`MeteredNotifications`): interrupted,
  resubmitted, waiting, capacity-wanted, decision, succeeded, failed, gave-up, cancelled;
- `CapacityDecisions` (placement): each capacity decision by where it put the job: spot, on-demand, wait;
- `GpuHours`, `GpuHoursLost`, `DollarsSpent`, `DollarsLost`: what an attempt spent, and lost, counted
  once, by the one write that stops it (`SpendMeter`, called by the jobs engine after each
  compare-and-set; the figures of `domain.jobs.spend`);
- `JobsByState` (state): how many jobs are in each live state, at every reconcile sweep.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit, single_metric

from spotguard.adapters.metrics import NAMESPACE
from spotguard.domain.jobs.model import Job, JobState
from spotguard.domain.jobs.replies import Notification
from spotguard.domain.jobs.spend import spend
from spotguard.ports import JobStore, Notifications

# A decision's market as the dashboard names it ("none" is the policy saying wait).
PLACEMENTS = {"spot": "spot", "on-demand": "on-demand", "none": "wait"}
LIVE_STATES = tuple(s for s in JobState if not s.terminal)


class MeteredNotifications:
    """The job notifications, counted once sent (a send that fails is retried with its transition)."""

    def __init__(self, inner: Notifications) -> None:
        self.inner = inner

    def send_all(self, notifications: list[Notification]) -> None:
        self.inner.send_all(notifications)
        for n in notifications:
            count_job_event(n)


def count_job_event(n: Notification) -> None:
    with single_metric(name="JobEvents", unit=MetricUnit.Count, value=1, namespace=NAMESPACE) as m:
        m.add_dimension(name="kind", value=n.kind)
    if n.kind == "decision":
        placement = PLACEMENTS.get(str(n.detail.get("placement")), "unknown")
        with single_metric(
            name="CapacityDecisions", unit=MetricUnit.Count, value=1, namespace=NAMESPACE
        ) as m:
            m.add_dimension(name="placement", value=placement)


class SpendMeter:
    """GPU-hours and dollars of each attempt whose task stopped: spent, and lost (run after its last
    committed checkpoint, which the next attempt does again). Dollars only when the price is known."""

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def __call__(self, before: Job | None, after: Job) -> None:
        """`before`: the job a write was computed on; `after`: the job written."""
        # an attempt is counted once its tasks have all stopped (a gang's: every node's)
        seen = {a.number for a in before.attempts if not a.live} if before else set()
        stopped = [
            a for a in after.attempts if not a.live and a.number not in seen and a.started_at is not None
        ]
        if not stopped:
            return
        times: dict[int, list[datetime]] = {}
        if any(a.outcome in ("resubmit", "failed", "cancelled") for a in stopped):  # lost is possible
            for ref in self.store.checkpoints(after.checkpoint_uri):
                if ref.created_at is not None:
                    times.setdefault(ref.attempt, []).append(ref.created_at)
        for a in stopped:
            alone = after.model_copy(update={"attempts": [a]})  # spend reads the attempts and the GPUs
            ends = [t.stopped_at for t in a.tasks if t.stopped_at is not None]
            s = spend(alone, times, max(ends) if ends else after.updated_at)
            metrics = EphemeralMetrics(namespace=NAMESPACE)
            metrics.add_metric(name="GpuHours", unit=MetricUnit.Count, value=s.gpu_hours)
            metrics.add_metric(name="GpuHoursLost", unit=MetricUnit.Count, value=s.gpu_hours_lost)
            if s.dollars is not None and s.dollars_lost is not None:
                metrics.add_metric(name="DollarsSpent", unit=MetricUnit.NoUnit, value=s.dollars)
                metrics.add_metric(name="DollarsLost", unit=MetricUnit.NoUnit, value=s.dollars_lost)
            metrics.flush_metrics()


def count_jobs_by_state(counts: Mapping[JobState, int]) -> None:
    for state, n in counts.items():
        with single_metric(name="JobsByState", unit=MetricUnit.Count, value=n, namespace=NAMESPACE) as m:
            m.add_dimension(name="state", value=str(state))
