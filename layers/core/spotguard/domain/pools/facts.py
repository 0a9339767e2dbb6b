"""Facts about a pool, folded into its record by pure functions that are safe to apply twice and in any
order: SpotGuard's own observations (launches, runs, interruptions, failures, rebalances), the backoff they
start, and the spot prices and placement scores read from EC2.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import AwareDatetime, Field

from spotguard.domain.pools.records import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    BACKOFF_SOURCES,
    LAUNCH_SOURCES,
    MAX_AHEAD,
    MAX_OBSERVATIONS,
    DecayedCount,
    Frozen,
    Observation,
    PoolRecord,
    as_utc,
)


def fold(pool: PoolRecord, fact: Observation, max_observations: int = MAX_OBSERVATIONS) -> PoolRecord:
    """The pool with one more fact. Safe to apply twice and in any order: a fact already kept (same
    time, source and detail) changes nothing, and so does one older than every kept fact once
    `max_observations` are kept (it would be dropped at once, and could otherwise be counted twice).
    The backoff is recomputed from the kept facts (`backoff`); the decayed counts add the new fact."""
    kept = pool.observations
    if any(o.ident == fact.ident for o in kept):
        return pool
    if len(kept) >= max_observations and fact.order < kept[0].order:
        return pool
    observations = tuple(sorted((*kept, fact), key=lambda o: o.order)[-max_observations:])
    until, streak = backoff(observations)
    update: dict[str, Any] = {
        "observations": observations,
        "unavailable_until": until,
        "backoff_streak": streak,
    }
    field = _counted_in(fact)
    if field is not None:
        update[field] = getattr(pool, field).add(fact.at)
    return pool.model_copy(update=update)


def _counted_in(fact: Observation) -> str | None:
    """The decayed count of the record a fact adds to, if any."""
    if not fact.available and fact.source in ("launch-failure", "provisioning-timeout"):
        return "launch_failures"
    if fact.source == "interruption":
        return "interruptions"
    if fact.source == "rebalance":
        return "rebalances"
    return None


def ahead_of_clock(at: datetime, now: datetime) -> str | None:
    """Why a fact dated `at` cannot be kept at `now` (None: it can): it is dated more than MAX_AHEAD
    ahead of the clock, or so near the end of the calendar that it has no UTC time. One line."""
    try:
        at = as_utc(at)
    except OverflowError:
        return f"time {at.isoformat()}: out of range"
    ahead = at - now
    if ahead <= MAX_AHEAD:
        return None
    days = ahead.days
    span = f"{days} days" if days > 1 else f"{int(ahead.total_seconds() // 60)} minutes"
    return (
        f"time {at.isoformat()} is {span} ahead of the clock ({now.isoformat(timespec='seconds')}); "
        f"at most {int(MAX_AHEAD.total_seconds() // 60)} minutes of clock skew are taken"
    )


def fold_all(pool: PoolRecord, facts: Iterable[Observation]) -> PoolRecord:
    for fact in facts:
        pool = fold(pool, fact)
    return pool


def backoff_length(streak: int) -> timedelta:
    """15 minutes for the first failure, doubling on each repeat, at most an hour."""
    return min(BACKOFF_FIRST * 2 ** max(streak - 1, 0), BACKOFF_MAX)


def backoff(observations: Sequence[Observation]) -> tuple[datetime | None, int]:
    """(unavailable until, streak) from the facts, oldest first. A capacity failure (a launch failure,
    a provisioning timeout, a RunTask capacity refusal, an interruption: `BACKOFF_SOURCES` with
    available False) makes the pool unavailable from its time for `backoff_length(streak)`. A failure
    while the pool is already backed off extends the backoff to its own time plus the current length, no
    more; one within BACKOFF_MAX after the backoff ended is a repeat and doubles it; a later one starts
    over at 15 minutes. A successful launch in the pool ends the backoff (`LAUNCH_SOURCES`: a task of
    SpotGuard's that started there, or an instance Auto Scaling launched for the group in the pool's zone;
    only a launch shows new capacity: a task running on an instance launched earlier does not)."""
    until: datetime | None = None
    streak = 0
    for o in observations:
        if o.source in LAUNCH_SOURCES and o.available:
            until, streak = None, 0
        elif not o.available and o.source in BACKOFF_SOURCES:
            if until is not None and o.at < until:
                until = max(until, o.at + backoff_length(streak))
            else:
                repeat = until is not None and o.at - until <= BACKOFF_MAX
                streak = streak + 1 if repeat else 1
                until = o.at + backoff_length(streak)
    return until, streak


class SpotQuote(Frozen):
    """A spot price read from EC2: the newest for a type in a zone (None: EC2 had none there)."""

    instance_type: str
    availability_zone: str
    price: float | None = Field(None, ge=0)
    at: AwareDatetime  # when it was read
    since: AwareDatetime | None = None  # when EC2 set it


class ScoreQuote(Frozen):
    """A spot placement score for a provider's types in a zone (None: none was given)."""

    capacity_provider: str
    availability_zone_id: str
    score: int | None = Field(None, ge=1, le=10)
    at: AwareDatetime  # when it was asked for


def with_spot_price(pool: PoolRecord, quote: SpotQuote) -> PoolRecord:
    """A spot pool with a newer reading of its spot price (an older one, one for another type or zone,
    or any for an on-demand pool changes nothing)."""
    if pool.market != "spot" or (quote.instance_type, quote.availability_zone) != (
        pool.instance_type,
        pool.availability_zone,
    ):
        return pool
    if pool.spot_priced_at is not None and quote.at <= pool.spot_priced_at:
        return pool
    return pool.model_copy(update={"spot_price": quote.price, "spot_priced_at": quote.at})


def with_score(pool: PoolRecord, quote: ScoreQuote) -> PoolRecord:
    """A spot pool with a newer placement score for its provider and zone (else unchanged)."""
    if pool.market != "spot" or (quote.capacity_provider, quote.availability_zone_id) != (
        pool.capacity_provider,
        pool.availability_zone_id,
    ):
        return pool
    if pool.scored_at is not None and quote.at <= pool.scored_at:
        return pool
    return pool.model_copy(update={"placement_score": quote.score, "scored_at": quote.at})


def without_facts_ahead(pool: PoolRecord, now: datetime) -> PoolRecord:
    """The pool without the facts dated more than MAX_AHEAD after `now` (see `ahead_of_clock`), its
    backoff recomputed from the others and each decayed count whose newest event was such a fact counted
    again from the kept facts. Unchanged (the same object) when it has none."""
    limit = now + MAX_AHEAD
    kept = tuple(o for o in pool.observations if o.at <= limit)
    if len(kept) == len(pool.observations):
        return pool
    until, streak = backoff(kept)
    update: dict[str, Any] = {"observations": kept, "unavailable_until": until, "backoff_streak": streak}
    for field in ("launch_failures", "interruptions", "rebalances"):
        count: DecayedCount = getattr(pool, field)
        if count.at is not None and count.at > limit:
            fresh = DecayedCount()
            for o in kept:
                if _counted_in(o) == field:
                    fresh = fresh.add(o.at)
            update[field] = fresh
    return pool.model_copy(update=update)


def rebalance_fact(at: datetime, instance_id: str) -> Observation:
    """EC2's rebalance recommendation for an instance of the pool: a risk signal (`RISK_SOURCES`), so
    `available` stays True (the instance was not lost). Its time is the event's and its detail the
    instance, so the same notice delivered again is the same fact (`fold` keeps it once)."""
    return Observation(at=at, available=True, source="rebalance", detail=instance_id)
