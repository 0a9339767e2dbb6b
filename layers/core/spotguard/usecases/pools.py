"""The pools of the watched clusters: discovered, priced, scored, kept in the ledger, and offered to the
capacity policy.

- `refresh(cluster, now)`: reconcile calls it for each watched cluster. It discovers the pools, reads the
  spot prices that are older than `price_ttl_hours` (one DescribeSpotPriceHistory for them all), asks
  the placement scores that are older than `score_ttl_hours` (one GetSpotPlacementScores per distinct
  set of a provider's types), and saves the lot (facts kept, vanished pools marked gone). A failure loses
  only what it must: discovery that fails raises (nothing is known of the cluster, nothing is saved);
  a price request that fails is asked again one type at a time, and a type whose price still cannot be
  read keeps the price its pools had (a new pool's is unknown: not available to the policy) until the
  next sweep asks again. What failed comes back in `Refreshed.errors`, one line each, and is logged.
- `pools(cluster)`: the capacity advisor reads them before each decision (one Query, no AWS call
  besides) and makes the policy's candidates of them (`domain.pools.pool_options`).
- `record_fact` / `record_group_fact`: what happened in a pool (a launch, an interruption, a failure, an
  instance Auto Scaling launched or could not launch for the pool's group).
- `PoolRebalanceFacts.record_rebalance`: the interruption function's rebalance recommendation for a host, on
  the pool the host is in.

Placement scores are asked only for providers of at least MIN_SCORED_TYPES instance types: EC2 scores
fewer types low whatever the capacity (its documented minimum), and a score that says nothing would bias
the policy against single-type pools. A failed score request means no score until the next one is due.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from spotguard.domain.clock import now as time_now
from spotguard.domain.pools import (
    Observation,
    PoolRecord,
    Refreshed,
    ScoreQuote,
    SpotQuote,
    ahead_of_clock,
    host_pools,
    matching_pools,
    pool_name,
    rebalance_fact,
    with_score,
    with_spot_price,
)
from spotguard.ports import HostPlacements, PoolFinder, PoolStore

if TYPE_CHECKING:
    from spotguard.domain.tasks import ContainerInstanceRef

log = logging.getLogger(__name__)

MIN_SCORED_TYPES = 3


class PoolSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    price_ttl_hours: float = Field(1.0, gt=0)  # spot prices move slowly: read them hourly
    score_ttl_hours: float = Field(6.0, gt=0)  # placement scores are rate limited: every 6 h


class PoolService:
    def __init__(
        self, finder: PoolFinder, ledger: PoolStore, region: str, settings: PoolSettings | None = None
    ) -> None:
        self.finder = finder
        self.ledger = ledger
        self.region = region
        self.settings = settings or PoolSettings()

    def refresh(self, cluster: str, now: datetime) -> Refreshed:
        """Discover, price, score and save a cluster's pools: the pools as stored now, and what failed
        (the rest kept). Raises when discovery itself fails (nothing is saved)."""
        discovery = self.finder.discover(cluster, now)
        for s in discovery.skipped:
            log.info(
                "cluster %s: capacity provider %s is not a pool: %s", cluster, s.capacity_provider, s.reason
            )
        name = discovery.cluster
        stored = {p.name: p for p in self.ledger.pools(name, include_gone=True)}
        errors: list[str] = []
        found = list(discovery.pools)
        found = self._priced(name, found, stored, now, errors)
        found = self._scored(found, stored, now)
        saved = self.ledger.save_discovered(name, found, now, complete=discovery.complete)
        return Refreshed(cluster=name, pools=tuple(saved), errors=tuple(errors))

    def _priced(
        self,
        cluster: str,
        found: list[PoolRecord],
        stored: dict[str, PoolRecord],
        now: datetime,
        errors: list[str],
    ) -> list[PoolRecord]:
        due = timedelta(hours=self.settings.price_ttl_hours)
        stale = [
            p for p in found if p.market == "spot" and _older(stored.get(p.name), "spot_priced_at", now, due)
        ]
        if not stale:
            return found
        quotes = self._spot_prices(
            cluster, {p.instance_type for p in stale}, {p.availability_zone for p in stale}, now, errors
        )
        by_pair = {(q.instance_type, q.availability_zone): q for q in quotes}
        names = {p.name for p in stale}
        return [
            with_spot_price(p, by_pair[(p.instance_type, p.availability_zone)])
            if p.name in names and (p.instance_type, p.availability_zone) in by_pair
            else p
            for p in found
        ]

    def _spot_prices(
        self, cluster: str, types: set[str], zones: set[str], now: datetime, errors: list[str]
    ) -> list[SpotQuote]:
        """The spot prices of the types in the zones: one request for them all; if it fails, one per
        type, so that a type EC2 refuses (or a call that fails) loses only its own prices."""
        try:
            return self.finder.spot_prices(types, zones, now)
        except Exception as exc:
            if len(types) == 1:
                errors.append(_failed(cluster, f"spot prices of {next(iter(types))}", exc))
                return []
            log.warning(
                "cluster %s: spot prices of %s in one request failed (%s); asking for each type alone",
                cluster,
                ",".join(sorted(types)),
                failure_reason(exc),
            )
        quotes: list[SpotQuote] = []
        for itype in sorted(types):
            try:
                quotes += self.finder.spot_prices({itype}, zones, now)
            except Exception as exc:
                errors.append(_failed(cluster, f"spot prices of {itype}", exc))
        return quotes

    def _scored(
        self, found: list[PoolRecord], stored: dict[str, PoolRecord], now: datetime
    ) -> list[PoolRecord]:
        due = timedelta(hours=self.settings.score_ttl_hours)
        providers: dict[tuple[str, ...], set[str]] = defaultdict(set)  # type set -> providers due a score
        for p in found:
            types = tuple(sorted(set(p.group_instance_types)))
            if (
                p.market == "spot"
                and len(types) >= MIN_SCORED_TYPES
                and p.availability_zone_id
                and _older(stored.get(p.name), "scored_at", now, due)
            ):
                providers[types].add(p.capacity_provider)
        quotes: list[ScoreQuote] = []
        for types, names in providers.items():
            scores = self.finder.placement_scores(types, self.region)
            zone_ids = {p.availability_zone_id for p in found if p.capacity_provider in names}
            quotes += [
                ScoreQuote(capacity_provider=cp, availability_zone_id=z, score=scores.get(z), at=now)
                for cp in sorted(names)
                for z in sorted(z for z in zone_ids if z)
            ]
        for quote in quotes:
            found = [with_score(p, quote) for p in found]
        return found

    def pools(self, cluster: str) -> list[PoolRecord]:
        return self.ledger.pools(cluster)

    def record_fact(self, cluster: str, pool_name: str, fact: Observation) -> PoolRecord | None:
        """Keep a fact about a pool (safe to repeat). None: the pool is not known (yet), the fact is lost."""
        pool = self.ledger.record(cluster, pool_name, fact)
        if pool is None:
            log.info("cluster %s has no pool %s: %s fact not kept", cluster, pool_name, fact.source)
        return pool

    def record_group_fact(
        self,
        cluster: str,
        auto_scaling_group: str,
        fact: Observation,
        availability_zone: str | None = None,
        instance_type: str | None = None,
    ) -> list[PoolRecord]:
        """Keep a fact about a group's pools (in a zone, of a type, when known), e.g. Auto Scaling's "EC2
        Instance Launch Unsuccessful" or "EC2 Instance Launch Successful" (domain.jobs.task_events.PoolEvent:
        group, zone; the latter names no instance type, so it is kept for every type of the group in the
        zone). The pools that kept it, as they stand with it (their backoff worked out with it)."""
        pools = matching_pools(
            self.ledger.pools(cluster), auto_scaling_group, availability_zone, instance_type
        )
        recorded = (self.ledger.record(cluster, p.name, fact) for p in pools)
        return [p for p in recorded if p is not None]


class PoolRebalanceFacts:
    """Facts about the pool a host is in, for the interruption function (which knows the host's container
    instance, not its pool). ECS says where the host is (one DescribeContainerInstances: its capacity
    provider, type and zone); when it names the provider, that is the pool's name, and the fact is folded
    into it (a read and a write); when it does not, the cluster's pools are read (one Query) and
    `domain.pools.host_pools` picks the one spot pool of that type and zone. A host in no discovered
    pool keeps no fact, and neither does a fact dated ahead of the clock (`ahead_of_clock`: kept, a
    rebalance dated 2030 would hold the pool's count undecayed until then). Safe to repeat: `fold` keeps a
    fact once."""

    def __init__(
        self,
        hosts: HostPlacements,
        ledger: PoolStore,
        clock: Callable[[], datetime] = time_now,
    ) -> None:
        self.hosts = hosts
        self.ledger = ledger
        self.clock = clock

    def record_rebalance(self, ref: ContainerInstanceRef, instance_id: str, at: datetime) -> list[str]:
        return self.record(ref, rebalance_fact(at, instance_id))

    def record(self, ref: ContainerInstanceRef, fact: Observation) -> list[str]:
        """Fold a fact into the host's pool; the pools' names that kept it (none: no pool known, or the
        fact is dated ahead of the clock)."""
        refused = ahead_of_clock(fact.at, self.clock())
        if refused is not None:
            log.warning("%s fact not kept: %s", fact.source, refused)
            return []
        where = self.hosts.placement(ref)
        if where is None:
            log.info("%s fact not kept: ECS no longer describes %s", fact.source, ref.container_instance_arn)
            return []
        if where.capacity_provider and where.instance_type and where.availability_zone:
            name = pool_name(where.capacity_provider, where.instance_type, where.availability_zone)
            names = [name] if self.ledger.record(where.cluster, name, fact) is not None else []
        else:
            pools = host_pools(self.ledger.pools(where.cluster), where)
            names = [p.name for p in pools if self.ledger.record(where.cluster, p.name, fact) is not None]
        if not names:
            log.info(
                "%s fact not kept: %s (%s) is in no pool of cluster %s",
                fact.source,
                ref.instance_id,
                where.model_dump(exclude={"cluster"}),
                where.cluster,
            )
        return names


def failure_reason(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of what it says."""
    said = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {said[0][:300]}" if said else type(exc).__name__


def _failed(cluster: str, what: str, exc: BaseException) -> str:
    """One failure of a refresh, said in one line and logged (a warning: the rest goes on)."""
    line = f"cluster {cluster}: {what} could not be read: {failure_reason(exc)}"
    log.warning("%s; kept as known until the next sweep", line)
    return line


def _older(pool: PoolRecord | None, field: str, now: datetime, due: timedelta) -> bool:
    """Whether a pool's reading (`spot_priced_at`, `scored_at`) is missing or `due` old."""
    at = getattr(pool, field, None) if pool is not None else None
    return at is None or now - at >= due
