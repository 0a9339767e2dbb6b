"""A pool's record and the facts it keeps: what discovery found of it, and what it has done. Pure.

A pool is one ECS capacity provider (an Auto Scaling group) of a watched cluster, narrowed to one instance
type in one availability zone, spot or on-demand; its `name` is "<capacity provider>/<instance type>/
<availability zone>". The ledger keeps one item per pool: pk "pool#<cluster>", sk the pool's name
(adapters/pool_store.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

PoolMarket = Literal["spot", "on-demand"]
Source = Literal[
    "launch",  # a task of SpotGuard's started in the pool
    "launch-success",  # Auto Scaling launched an instance for the pool's group in its zone
    "run",
    "interruption",
    "rebalance",
    "launch-failure",
    "provisioning-timeout",
    "runtask",
    "provider-refused",  # RunTask: ECS refused the capacity provider (not attached, not ACTIVE)
]

# ------------------------------------------------------------------------------ the facts' bounds
MAX_OBSERVATIONS = 100  # kept per pool (about 15 KB of the ledger item at most); older ones are dropped
MAX_DETAIL = 160  # characters of an observation's detail
BACKOFF_FIRST = timedelta(minutes=15)  # a capacity failure makes the pool unavailable for this long,
BACKOFF_MAX = timedelta(hours=1)  # doubling on each repeat, up to this
BACKOFF_SOURCES = frozenset(
    {"launch-failure", "provisioning-timeout", "runtask", "interruption", "provider-refused"}
)
LAUNCH_SOURCES = frozenset({"launch", "launch-success"})  # new capacity seen: an available one ends a backoff
# Risk signals: EC2's rebalance recommendation says an instance of the pool is at elevated risk of
# interruption, not that capacity was lost or found. Such a fact is counted (`PoolRecord.rebalances`) and
# kept, but neither backs the pool off, nor is evidence of capacity (`confirmed_at`), nor an observation
# in the planner's history (`capacity_facts`).
RISK_SOURCES = frozenset({"rebalance"})
# A capacity provider ECS refused (detached from the cluster, or being deleted) says nothing about spot
# capacity: it backs the pool off and is the newest word on it (`confirmed_at`), but it is no observation
# in the planner's history of the pool's spot availability.
NOT_HISTORY = RISK_SOURCES | {"provider-refused"}
COUNT_HALF_LIFE_HOURS = 24.0  # the decayed counts of launch failures, interruptions, rebalances
HOLD_HOURS = 2.0  # an observation holds (in the history) until the next one, for at most this long
# A fact is about the past: its time may be ahead of SpotGuard's clock by clock skew (the service that
# stamped the event and the Lambda's clock drift apart by seconds), never more. A fact dated further ahead
# is refused (`ahead_of_clock`): kept, it would sort after every fact that really came later, back the
# pool off until its date, and near the end of the calendar overflow the backoff's arithmetic. A fact
# dated in the past, however far, is kept as history: weighed by its time (`backoff`), it backs nothing
# off now.
MAX_AHEAD = timedelta(minutes=5)


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


def as_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


# ================================================================================== the pool record
class Observation(Frozen):
    """One fact about a pool's capacity: was it there at `at`, according to what."""

    at: AwareDatetime
    available: bool
    source: Source
    detail: str = ""

    @field_validator("at")
    @classmethod
    def _in_utc(cls, value: datetime) -> datetime:
        return as_utc(value)

    @field_validator("detail", mode="before")
    @classmethod
    def _short(cls, value: Any) -> Any:
        return value[:MAX_DETAIL] if isinstance(value, str) else value

    @property
    def ident(self) -> tuple[datetime, str, str]:
        """What makes a fact the same fact when it comes again (a redelivered event)."""
        return (self.at, self.source, self.detail)

    @property
    def order(self) -> tuple[datetime, str, str, bool]:
        return (self.at, self.source, self.detail, self.available)


class DecayedCount(Frozen):
    """A count whose every event weighs half as much `half_life_hours` later: `value` as of `at`."""

    value: float = 0.0
    at: AwareDatetime | None = None

    def add(self, when: datetime, half_life_hours: float = COUNT_HALF_LIFE_HOURS) -> DecayedCount:
        """One more event at `when` (in any order: the result does not depend on it)."""
        if self.at is None:
            return DecayedCount(value=1.0, at=when)
        newest = max(self.at, when)
        return DecayedCount(
            value=self.value * _decay(newest - self.at, half_life_hours)
            + _decay(newest - when, half_life_hours),
            at=newest,
        )

    def value_at(self, now: datetime, half_life_hours: float = COUNT_HALF_LIFE_HOURS) -> float:
        if self.at is None:
            return 0.0
        return self.value * _decay(max(now - self.at, timedelta(0)), half_life_hours)


def _decay(elapsed: timedelta, half_life_hours: float) -> float:
    return 0.5 ** (elapsed.total_seconds() / 3600 / half_life_hours)


class PoolRecord(Frozen):
    """One pool: where it is (provider, group, type, zone), what it costs, and what it has done."""

    cluster: str  # the cluster's name
    capacity_provider: str
    auto_scaling_group: str
    market: PoolMarket
    instance_type: str
    availability_zone: str
    availability_zone_id: str | None = None  # e.g. use1-az4: what placement scores are given for
    gpus_per_instance: int = Field(ge=0)
    constrain_type: bool  # the provider spans several types: RunTask adds ecs.instance-type == T
    constrain_zone: bool  # ... several zones: RunTask adds ecs.availability-zone == Z
    group_instance_types: tuple[str, ...] = ()  # every type of the provider, in the group's order
    max_instances: int | None = None  # the group's MaxSize: a multi-node job needs a pool that holds it
    on_demand_price: float | None = Field(None, gt=0)  # $/h per instance; None: not known
    on_demand_price_source: Literal["table", "tag"] | None = None
    spot_price: float | None = Field(None, ge=0)  # $/h per instance, the newest EC2 answered
    spot_priced_at: AwareDatetime | None = None  # when it was read (also when EC2 had none)
    placement_score: int | None = Field(None, ge=1, le=10)
    scored_at: AwareDatetime | None = None  # when a score was last asked for (also when none came)
    discovered_at: AwareDatetime
    gone_since: AwareDatetime | None = None  # no longer in the cluster (kept a while, then expires)
    observations: tuple[Observation, ...] = ()  # oldest first, at most MAX_OBSERVATIONS
    unavailable_until: AwareDatetime | None = None  # after a capacity failure (see `fold`)
    backoff_streak: int = Field(0, ge=0)  # failures in a row that each started a backoff
    launch_failures: DecayedCount = DecayedCount()  # launch failures and provisioning timeouts
    interruptions: DecayedCount = DecayedCount()
    rebalances: DecayedCount = DecayedCount()

    @property
    def name(self) -> str:
        """ "<capacity provider>/<instance type>/<availability zone>": what users see in `status` and
        decisions, and give `spotguard local inject capacity-shortage --pool NAME`."""
        return pool_name(self.capacity_provider, self.instance_type, self.availability_zone)

    @property
    def key(self) -> tuple[str, str]:
        """The ledger item's (pk, sk)."""
        return pool_key(self.cluster), self.name

    def available_at(self, now: datetime) -> bool:
        """Not backed off after a capacity failure (and still in the cluster)."""
        return self.gone_since is None and (self.unavailable_until is None or self.unavailable_until <= now)

    def confirmed_at(self, now: datetime) -> bool:
        """Available with evidence: `available_at(now)`, and the pool's newest fact about capacity says
        it was there (a launch, an instance Auto Scaling launched, a run), or it has no such fact (a
        fresh pool). A risk signal (a rebalance recommendation) is no fact about capacity either way,
        and a backoff that merely expired is no evidence that the shortage ended: `available_at` is
        enough for a launch (the job waits anyway, and a failure marks the pool again), but a move,
        which stops a healthy task for the pool, asks for `confirmed_at`."""
        if not self.available_at(now):
            return False
        facts = self.capacity_facts
        return not facts or facts[-1].available

    @property
    def capacity_facts(self) -> tuple[Observation, ...]:
        """The observations that say whether capacity was there, oldest first: all but risk signals
        (`RISK_SOURCES`: a rebalance recommendation is neither a lost instance nor a launch)."""
        return tuple(o for o in self.observations if o.source not in RISK_SOURCES)

    @property
    def history_facts(self) -> tuple[Observation, ...]:
        """The observations of the pool's spot availability, the planner's history: the capacity facts
        but a refused capacity provider (`NOT_HISTORY`)."""
        return tuple(o for o in self.observations if o.source not in NOT_HISTORY)


def pool_name(capacity_provider: str, instance_type: str, availability_zone: str) -> str:
    return f"{capacity_provider}/{instance_type}/{availability_zone}"


def pool_key(cluster: str) -> str:
    return f"pool#{cluster}"
