"""Metrics in CloudWatch EMF and optional tracing, shared by the handlers."""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from spotguard.domain.interruption.notices import Decision, NoticeOutcome

NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "SpotGuard")


def count_decision(metrics: Metrics, decision: Decision) -> None:
    """Notices by kind and outcome: one EMF blob per record, since the dimensions differ by record."""
    with single_metric(name="Notices", unit=MetricUnit.Count, value=1, namespace=NAMESPACE) as m:
        m.add_dimension(name="kind", value=decision.kind or "unknown")
        m.add_dimension(name="outcome", value=decision.outcome)


def count_outcome(metrics: Metrics, outcome: NoticeOutcome) -> None:
    if outcome.repeat:  # a notice delivered again: counted when it was handled
        return
    signalled = len(outcome.signalled)
    if signalled and outcome.signal:
        metrics.add_metric(name="TasksSignalled", unit=MetricUnit.Count, value=signalled)
    if outcome.signal_latency_seconds is not None:
        metrics.add_metric(
            name="SecondsToSignal", unit=MetricUnit.Seconds, value=outcome.signal_latency_seconds
        )
    if outcome.drained:
        metrics.add_metric(name="HostsDrained", unit=MetricUnit.Count, value=1)
    if outcome.pool_facts:  # a rebalance recommendation kept on the host's pool
        metrics.add_metric(name="PoolRebalances", unit=MetricUnit.Count, value=len(outcome.pool_facts))
    if outcome.pool_fact_error:  # ... or not kept: the notice was handled all the same
        metrics.add_metric(name="PoolFactsNotKept", unit=MetricUnit.Count, value=1)


def tracer() -> Any:
    """A Powertools Tracer only when the stack turns tracing on: creating one loads the X-Ray SDK,
    about 450 ms of cold start that nobody should pay for tracing they did not ask for."""
    if os.environ.get("SPOTGUARD_TRACING", "false").lower() != "true":
        return None
    from aws_lambda_powertools import Tracer

    return Tracer()
