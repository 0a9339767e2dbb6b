"""Composition roots for the Lambdas: each function's runtime builds its adapters from the environment
once per cold start and wraps its use cases in Powertools idempotency. One module per runtime, so that
a function imports only what its own path uses (the interruption function loads nothing of the jobs
path). Handlers in functions/ import their runtime from here and stay thin."""

from __future__ import annotations

from datetime import datetime

from spotguard.domain import clock


def utcnow() -> datetime:
    return clock.now()
