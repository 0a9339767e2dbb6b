"""One reconcile sweep's bookkeeping: what it counts (`SweepCounts`, each count with the metric it is
emitted as) and how it lists and isolates jobs (`Sweep`: a job whose handling fails is logged and
counted, and the sweep goes on)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from spotguard.domain.jobs.model import Job, JobState, UnreadableJob
from spotguard.ports import JobStore

# the reconcile module's logger: a job that failed in a sweep is said where the sweep is
log = logging.getLogger("spotguard.usecases.jobs.reconcile")


def _count(metric: str | None) -> Any:
    return field(default=0, metadata={"metric": metric})


@dataclass
class SweepCounts:
    """What a sweep did, each a count. The reconcile function answers them all (`answer`) and emits each
    one that is not zero as the metric named beside it (`metrics`; `checked` is none); the dashboard reads
    the same names (tests/template/test_dashboard.py)."""

    checked: int = _count(None)
    relaunched: int = _count("ReconcileRelaunched")
    stops_applied: int = _count("ReconcileStopsApplied")
    vanished: int = _count("ReconcileVanished")
    snapshots_settled: int = _count("ReconcileSnapshotsSettled")
    unreadable: int = _count("ReconcileUnreadable")
    failed: int = _count("ReconcileFailed")
    pools: int = _count("ReconcilePools")
    discovery_errors: int = _count("ReconcileDiscoveryErrors")
    provisioning_abandoned: int = _count("ReconcileProvisioningAbandoned")
    moves_started: int = _count("ReconcileMovesStarted")
    moves_stopped: int = _count("ReconcileMovesStopped")
    moves_stop_retried: int = _count("ReconcileMovesStopRetried")
    moves_abandoned: int = _count("ReconcileMovesAbandoned")
    spares_given_back: int = _count("ReconcileSparesGivenBack")
    gangs_abandoned: int = _count("ReconcileGangsAbandoned")
    gang_nodes_launched: int = _count("ReconcileGangNodesLaunched")
    gang_stragglers_stopped: int = _count("ReconcileGangStragglersStopped")
    gang_stops_retried: int = _count("ReconcileGangStopsRetried")
    cancel_stops_retried: int = _count("ReconcileCancelStopsRetried")
    runs_applied: int = _count("ReconcileRunsApplied")

    def answer(self) -> dict[str, int]:
        return asdict(self)

    def metrics(self) -> list[tuple[str, int]]:
        """(metric name, count) for each count that is a metric and not zero."""
        return [(m, v) for m, v in zip(self.metric_names(), self._metric_values(), strict=True) if v]

    @classmethod
    def metric_names(cls) -> list[str]:
        return [f.metadata["metric"] for f in fields(cls) if f.metadata["metric"]]

    def _metric_values(self) -> list[int]:
        return [getattr(self, f.name) for f in fields(self) if f.metadata["metric"]]


class Sweep:
    """One sweep's listings and counts: each job's handling is isolated, so one that fails is logged and
    counted (`failed`) and the sweep goes on."""

    def __init__(self, store: JobStore, limit: int) -> None:
        self.store, self.limit = store, limit
        self.counts = SweepCounts()

    def unreadable(self, exc: UnreadableJob) -> None:
        self.counts.unreadable += 1

    def each(self, state: JobState) -> list[Job]:
        # oldest first: the jobs most likely to be stuck are the ones that waited longest
        jobs = self.store.list(state, self.limit, on_unreadable=self.unreadable, oldest_first=True)
        self.counts.checked += len(jobs)
        return jobs

    def isolated(self, job: Job, work: Callable[[], object]) -> object:
        try:
            return work()
        except Exception:
            log.exception("reconcile could not handle job %s; the sweep goes on", job.job_id)
            self.counts.failed += 1
            return None
