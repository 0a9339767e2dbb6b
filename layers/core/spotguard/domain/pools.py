"""Pools: where a task can be placed, discovered from the cluster itself, and what each has done. Pure.

A pool is one ECS capacity provider (an Auto Scaling group) of a watched cluster, narrowed to one instance
type in one availability zone, spot or on-demand. Nothing is configured for the common cluster (spot and
on-demand groups over a few types and zones, each a capacity provider): `discover_pools` reads the
cluster's providers, their groups, launch templates, subnets and instance types, as the APIs describe
them, and makes one `PoolRecord` per (provider, type, zone). A provider tagged `spotguard:pool=ignore` is
left out; FARGATE and FARGATE_SPOT are never pools.

A pool's `name` is "<capacity provider>/<instance type>/<availability zone>", e.g.
"gpu-spot-gpu1-spot/g5.xlarge/us-east-1a": the name users see in `status` and in capacity decisions, and
the one they give `spotguard local inject capacity-shortage --pool NAME`. When the provider spans several
types (or zones), RunTask must narrow it to the pool's: `constrain_type` / `constrain_zone` say so, and
`domain.jobs.placement.placement_params` gives the strategy and constraints of a decision in the pool.

Each record also carries the facts the capacity policy needs: the spot price (read hourly) and the spot
placement score (every few hours), and SpotGuard's own observations of the pool (launches, runs,
interruptions, failures), from which `availability_history` rebuilds the planner's tick-based history and
`pool_options` the planner's input. Facts are folded in by pure functions that are safe to apply twice.

The ledger keeps one item per pool: pk "pool#<cluster>", sk the pool's name (adapters/pool_store.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from spotguard.domain.prices import GPU_INSTANCES, gpus_of

if TYPE_CHECKING:  # the planner needs numpy: loaded only where options are built
    from spotguard.domain.planner import AvailabilityHistory, PoolOption

Market = Literal["spot", "on-demand"]
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

IGNORE_TAG = "spotguard:pool"  # value "ignore" leaves the capacity provider out
PRICE_TAG = "spotguard:on-demand-price"
NOT_POOLS = frozenset({"FARGATE", "FARGATE_SPOT"})

# ------------------------------------------------------------------------------ on-demand prices
# USD per instance-hour, Linux, shared tenancy, US East (N. Virginia). Source: the AWS EC2 On-Demand
# pricing page (aws.amazon.com/ec2/pricing/on-demand), read in 2025, after the June 2025 reductions of
# P4/P5. The GPU types SpotGuard has always known come from domain/prices.py (one table, so the two
# cannot drift); the g6e family and the CPU types of the examples are added here. Other regions cost
# more or less: tag the capacity provider `spotguard:on-demand-price` there (see `price_override`).
ON_DEMAND_PRICES: dict[str, float] = {
    **{itype: price for itype, (_gpus, price) in GPU_INSTANCES.items()},
    "g6e.xlarge": 1.861,
    "g6e.2xlarge": 2.242,
    "g6e.4xlarge": 3.004,
    "g6e.8xlarge": 4.529,
    "g6e.12xlarge": 10.493,
    "g6e.16xlarge": 7.577,
    "g6e.24xlarge": 15.066,
    "g6e.48xlarge": 30.131,
    # CPU types of examples/gpu-cluster (the non-GPU services' group) and common small ones.
    "m7i.large": 0.1008,
    "m6i.large": 0.096,
    "m6a.large": 0.0864,
    "m5.large": 0.096,
    "c6i.xlarge": 0.17,
    "c5.xlarge": 0.17,
    "t3.medium": 0.0416,
}

# A pool whose on-demand price is unknown (a type missing above, no tag) is not given a guessed price: its
# record says None. The policy needs a number, so `pool_options` gives it this penalty instead: twice the
# dearest known price per GPU (p5.48xlarge), per GPU of the pool (per instance for a CPU pool). It is a
# penalty, not an estimate: the pool is then costlier on-demand than any priced one, so on-demand goes to
# a priced pool whenever one fits; spot in it is still used (its spot price is real).
UNPRICED_PER_GPU = 2 * max(price / gpus for gpus, price in GPU_INSTANCES.values())

# ------------------------------------------------------------------------------ facts' constants
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


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


# ==================================================================================== the API shapes
class _Api(BaseModel):
    """A part of an AWS answer, read by its API names (aliases); whatever else it holds is ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class EcsTag(_Api):
    key: str
    value: str = ""


class AsgProvider(_Api):
    auto_scaling_group_arn: str = Field(alias="autoScalingGroupArn")


class CapacityProvider(_Api):
    """DescribeCapacityProviders' `capacityProviders[]` (asked with include=["TAGS"])."""

    name: str
    status: str = "ACTIVE"
    auto_scaling_group_provider: AsgProvider | None = Field(None, alias="autoScalingGroupProvider")
    tags: tuple[EcsTag, ...] = ()

    def tag(self, key: str) -> str | None:
        return next((t.value for t in self.tags if t.key == key), None)

    @property
    def group_name(self) -> str | None:
        """The group's name: ECS answers its ARN (…:autoScalingGroupName/<name>), or the name given."""
        if self.auto_scaling_group_provider is None:
            return None
        arn = self.auto_scaling_group_provider.auto_scaling_group_arn
        return arn.split(":autoScalingGroupName/", 1)[1] if ":autoScalingGroupName/" in arn else arn


class LaunchTemplateSpec(_Api):
    template_id: str | None = Field(None, alias="LaunchTemplateId")
    template_name: str | None = Field(None, alias="LaunchTemplateName")
    version: str | None = Field(None, alias="Version")

    @property
    def ref(self) -> tuple[str, str]:
        """(by what, which) for DescribeLaunchTemplateVersions: ("id", id) or ("name", name)."""
        return ("id", self.template_id) if self.template_id else ("name", self.template_name or "")


class Override(_Api):
    instance_type: str | None = Field(None, alias="InstanceType")
    launch_template: LaunchTemplateSpec | None = Field(None, alias="LaunchTemplateSpecification")


class MixedTemplate(_Api):
    spec: LaunchTemplateSpec = Field(alias="LaunchTemplateSpecification")
    overrides: tuple[Override, ...] = Field((), alias="Overrides")


class Distribution(_Api):
    """InstancesDistribution, with the API's defaults (base 0, 100 % on-demand above it)."""

    on_demand_base: int = Field(0, alias="OnDemandBaseCapacity")
    on_demand_percent: int = Field(100, alias="OnDemandPercentageAboveBaseCapacity")


class MixedPolicy(_Api):
    launch_template: MixedTemplate = Field(alias="LaunchTemplate")
    distribution: Distribution = Field(Distribution(), alias="InstancesDistribution")


class AutoScalingGroup(_Api):
    """DescribeAutoScalingGroups' `AutoScalingGroups[]`."""

    name: str = Field(alias="AutoScalingGroupName")
    launch_template: LaunchTemplateSpec | None = Field(None, alias="LaunchTemplate")
    mixed: MixedPolicy | None = Field(None, alias="MixedInstancesPolicy")
    launch_configuration: str | None = Field(None, alias="LaunchConfigurationName")
    subnets: str = Field("", alias="VPCZoneIdentifier")  # comma-separated subnet ids
    zones: tuple[str, ...] = Field((), alias="AvailabilityZones")

    @property
    def subnet_ids(self) -> list[str]:
        return [s.strip() for s in self.subnets.split(",") if s.strip()]

    def templates(self) -> list[LaunchTemplateSpec]:
        """The launch templates whose data discovery needs: the group's own when it has no mixed policy
        (type and market), or the mixed policy's when it overrides no instance type (type only)."""
        if self.mixed is None:
            return [self.launch_template] if self.launch_template else []
        if not any(o.instance_type for o in self.mixed.launch_template.overrides):
            return [self.mixed.launch_template.spec]
        return []


class MarketOptions(_Api):
    market_type: str | None = Field(None, alias="MarketType")


class TemplateData(_Api):
    instance_type: str | None = Field(None, alias="InstanceType")
    market: MarketOptions | None = Field(None, alias="InstanceMarketOptions")


class TemplateVersion(_Api):
    """DescribeLaunchTemplateVersions' `LaunchTemplateVersions[]`."""

    template_id: str = Field(alias="LaunchTemplateId")
    template_name: str = Field("", alias="LaunchTemplateName")
    version: int = Field(alias="VersionNumber")
    default: bool = Field(False, alias="DefaultVersion")
    data: TemplateData = Field(TemplateData(), alias="LaunchTemplateData")


class Subnet(_Api):
    subnet_id: str = Field(alias="SubnetId")
    zone: str = Field(alias="AvailabilityZone")
    zone_id: str | None = Field(None, alias="AvailabilityZoneId")


class Gpu(_Api):
    count: int = Field(0, alias="Count")


class GpuInfo(_Api):
    gpus: tuple[Gpu, ...] = Field((), alias="Gpus")


class InstanceTypeInfo(_Api):
    """DescribeInstanceTypes' `InstanceTypes[]`: a type without GpuInfo has no GPU."""

    instance_type: str = Field(alias="InstanceType")
    gpu_info: GpuInfo | None = Field(None, alias="GpuInfo")

    @property
    def gpus(self) -> int:
        return sum(g.count for g in self.gpu_info.gpus) if self.gpu_info else 0


class ClusterDescription(_Frozen):
    """Everything discovery reads about one cluster, as the APIs answered it."""

    cluster: str  # the cluster's name
    capacity_providers: tuple[CapacityProvider, ...] = ()
    auto_scaling_groups: tuple[AutoScalingGroup, ...] = ()
    launch_templates: tuple[TemplateVersion, ...] = ()
    subnets: tuple[Subnet, ...] = ()
    instance_types: tuple[InstanceTypeInfo, ...] = ()
    # What could not be described (a provider ECS answered as a failure, a template it could not find):
    # discovery is then incomplete, and pools missing from it are not taken for gone.
    failures: tuple[str, ...] = ()


# ================================================================================== the pool record
class Observation(_Frozen):
    """One fact about a pool's capacity: was it there at `at`, according to what."""

    at: AwareDatetime
    available: bool
    source: Source
    detail: str = ""

    @field_validator("at")
    @classmethod
    def _in_utc(cls, value: datetime) -> datetime:
        return _utc(value)

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


class DecayedCount(_Frozen):
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


class PoolRecord(_Frozen):
    """One pool: where it is (provider, group, type, zone), what it costs, and what it has done."""

    cluster: str  # the cluster's name
    capacity_provider: str
    auto_scaling_group: str
    market: Market
    instance_type: str
    availability_zone: str
    availability_zone_id: str | None = None  # e.g. use1-az4: what placement scores are given for
    gpus_per_instance: int = Field(ge=0)
    constrain_type: bool  # the provider spans several types: RunTask adds ecs.instance-type == T
    constrain_zone: bool  # ... several zones: RunTask adds ecs.availability-zone == Z
    group_instance_types: tuple[str, ...] = ()  # every type of the provider, in the group's order
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


class Skipped(_Frozen):
    capacity_provider: str
    reason: str


class Discovery(_Frozen):
    """What discovery found: the pools, the providers it left out and why, and whether it saw everything
    (if not, a stored pool it did not find is not taken for gone)."""

    cluster: str
    pools: tuple[PoolRecord, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    complete: bool = True


class Refreshed(_Frozen):
    """A cluster's pools after a refresh, and what of it failed: one line per call that failed and what
    was lost with it (e.g. one type's spot price: its pools keep the price they had, or none). The rest
    of the refresh is kept."""

    cluster: str
    pools: tuple[PoolRecord, ...] = ()
    errors: tuple[str, ...] = ()


# ======================================================================================== discovery
def group_market(group: AutoScalingGroup, template: TemplateData | None) -> Market:
    """Spot or on-demand, from the group as Auto Scaling describes it:
    - a MixedInstancesPolicy whose InstancesDistribution has OnDemandBaseCapacity 0 and
      OnDemandPercentageAboveBaseCapacity 0 is spot; any other distribution (100 %, or a mix of both
      markets) is taken as on-demand: a mixed group may give on-demand capacity at on-demand prices, and
      counting it as spot would make the policy plan with prices and interruptions it may not get;
    - a group on a launch template (no mixed policy) is spot when the template's
      InstanceMarketOptions.MarketType is "spot", else on-demand (Auto Scaling refuses a spot template in
      a mixed policy, so the template's market only matters here)."""
    if group.mixed is not None:
        d = group.mixed.distribution
        return "spot" if d.on_demand_percent == 0 and d.on_demand_base == 0 else "on-demand"
    if template is not None and template.market is not None and template.market.market_type == "spot":
        return "spot"
    return "on-demand"


def resolve_template(spec: LaunchTemplateSpec, versions: Iterable[TemplateVersion]) -> TemplateVersion | None:
    """The version a group launches from: Version "$Latest", "$Default" (also when none is given) or a
    number, among the versions described for the template (by id or name)."""
    same = [
        v
        for v in versions
        if (spec.template_id and v.template_id == spec.template_id)
        or (spec.template_name and v.template_name == spec.template_name)
    ]
    wanted = spec.version or "$Default"
    if wanted == "$Latest":
        return max(same, key=lambda v: v.version, default=None)
    if wanted == "$Default":
        return next((v for v in same if v.default), None)
    return next((v for v in same if str(v.version) == wanted.strip()), None)


def price_override(tag: str, instance_type: str) -> float | None:
    """The `spotguard:on-demand-price` tag's price for a type: "1.23" (every type of the provider) or
    "g5.xlarge=1.006,g5.2xlarge=1.212" (per type; a type it does not name: None, the table decides).
    Raises ValueError for a value that is not a positive price."""
    parts = [p.strip() for p in tag.split(",") if p.strip()]
    if len(parts) == 1 and "=" not in parts[0]:
        return _price(parts[0])
    for part in parts:
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{part!r} is neither a price nor type=price")
        if name.strip() == instance_type:
            return _price(value)
    return None


def _price(text: str) -> float:
    price = float(text.strip().lstrip("$"))
    if not math.isfinite(price) or price <= 0:
        raise ValueError(f"{text!r} is not a positive price")
    return price


def discover_pools(described: ClusterDescription, now: datetime) -> Discovery:
    """The pools of a cluster: one per (capacity provider, instance type, zone) of each provider's Auto
    Scaling group. Left out, with the reason: FARGATE and FARGATE_SPOT (silently), providers tagged
    `spotguard:pool=ignore`, inactive ones, ones without a group, and groups whose types cannot be known
    (a launch configuration, attribute-based overrides without a type, a template without one)."""
    groups = {g.name: g for g in described.auto_scaling_groups}
    subnets = {s.subnet_id: s for s in described.subnets}
    gpus = {t.instance_type: t.gpus for t in described.instance_types}
    pools: list[PoolRecord] = []
    skipped: list[Skipped] = []
    complete = not described.failures

    def skip(provider: str, reason: str) -> None:
        skipped.append(Skipped(capacity_provider=provider, reason=reason))

    for cp in sorted(described.capacity_providers, key=lambda c: c.name):
        if cp.name in NOT_POOLS:
            continue
        if (cp.tag(IGNORE_TAG) or "").strip().lower() == "ignore":
            skip(cp.name, f"tagged {IGNORE_TAG}=ignore")
            continue
        if cp.status != "ACTIVE":
            skip(cp.name, f"the capacity provider is {cp.status}")
            continue
        group = groups.get(cp.group_name or "")
        if group is None:
            skip(cp.name, f"its Auto Scaling group {cp.group_name or '(none)'} was not found")
            continue
        types, market, why = _types_and_market(group, described.launch_templates)
        if why:
            skip(cp.name, why)
            continue
        zones: list[tuple[str, str | None]] = []
        for subnet_id in group.subnet_ids:
            subnet = subnets.get(subnet_id)
            if subnet is None:
                complete = False
                skip(cp.name, f"subnet {subnet_id} of group {group.name} was not described")
                continue
            zones.append((subnet.zone, subnet.zone_id))
        if not group.subnet_ids:
            zones = [(z, None) for z in group.zones]
        zones = list(dict.fromkeys(zones))
        if not zones:
            skip(cp.name, f"group {group.name} has no zone")
            continue
        tag = cp.tag(PRICE_TAG)
        for itype in types:
            price, source = _on_demand_price(tag, itype)
            for zone, zone_id in zones:
                pools.append(
                    PoolRecord(
                        cluster=described.cluster,
                        capacity_provider=cp.name,
                        auto_scaling_group=group.name,
                        market=market,
                        instance_type=itype,
                        availability_zone=zone,
                        availability_zone_id=zone_id,
                        gpus_per_instance=gpus.get(itype, gpus_of(itype) or 0),
                        constrain_type=len(types) > 1,
                        constrain_zone=len(zones) > 1,
                        group_instance_types=tuple(types),
                        on_demand_price=price,
                        on_demand_price_source=source,
                        discovered_at=now,
                    )
                )
    return Discovery(cluster=described.cluster, pools=tuple(pools), skipped=tuple(skipped), complete=complete)


def _types_and_market(
    group: AutoScalingGroup, versions: Sequence[TemplateVersion]
) -> tuple[list[str], Market, str | None]:
    """(the group's instance types in its order, its market, why it cannot be a pool or None)."""
    if group.mixed is not None:
        overrides = group.mixed.launch_template.overrides
        types = [o.instance_type for o in overrides if o.instance_type]
        if overrides and not types:
            return [], "on-demand", f"group {group.name} selects types by attributes, not by name"
        if not types:
            template = resolve_template(group.mixed.launch_template.spec, versions)
            if template is None or not template.data.instance_type:
                return [], "on-demand", f"group {group.name}'s launch template names no instance type"
            types = [template.data.instance_type]
        return list(dict.fromkeys(types)), group_market(group, None), None
    if group.launch_template is not None:
        template = resolve_template(group.launch_template, versions)
        if template is None:
            return [], "on-demand", f"group {group.name}'s launch template version was not described"
        if not template.data.instance_type:
            return [], "on-demand", f"group {group.name}'s launch template names no instance type"
        return [template.data.instance_type], group_market(group, template.data), None
    if group.launch_configuration:
        return [], "on-demand", f"group {group.name} uses a launch configuration (not supported)"
    return [], "on-demand", f"group {group.name} has no launch template"


def _on_demand_price(
    tag: str | None, instance_type: str
) -> tuple[float | None, Literal["table", "tag"] | None]:
    if tag is not None:
        try:
            price = price_override(tag, instance_type)
        except ValueError:
            price = None  # a bad tag is no price: the table decides (the tag shows in `status`)
        if price is not None:
            return price, "tag"
    known = ON_DEMAND_PRICES.get(instance_type)
    return (known, "table") if known is not None else (None, None)


# ========================================================================================= the facts
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
        at = _utc(at)
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


class SpotQuote(_Frozen):
    """A spot price read from EC2: the newest for a type in a zone (None: EC2 had none there)."""

    instance_type: str
    availability_zone: str
    price: float | None = Field(None, ge=0)
    at: AwareDatetime  # when it was read
    since: AwareDatetime | None = None  # when EC2 set it


class ScoreQuote(_Frozen):
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


def merge_discovered(stored: PoolRecord | None, found: PoolRecord) -> PoolRecord:
    """A pool found again: where it is and its on-demand price as discovery says now; its facts, first
    discovery, and the newer of the two spot prices and scores as they were. It is no longer gone. Facts
    dated ahead of the clock (`discovered_at` + MAX_AHEAD), kept before they were refused at the door,
    are dropped, and the backoff and counts they skewed are worked out again from the rest."""
    if stored is None:
        return found
    stored = without_facts_ahead(stored, found.discovered_at)
    update: dict[str, Any] = {
        "discovered_at": stored.discovered_at,
        "gone_since": None,
        "observations": stored.observations,
        "unavailable_until": stored.unavailable_until,
        "backoff_streak": stored.backoff_streak,
        "launch_failures": stored.launch_failures,
        "interruptions": stored.interruptions,
        "rebalances": stored.rebalances,
    }
    if found.spot_priced_at is None or (
        stored.spot_priced_at and stored.spot_priced_at >= found.spot_priced_at
    ):
        update |= {"spot_price": stored.spot_price, "spot_priced_at": stored.spot_priced_at}
    if found.scored_at is None or (stored.scored_at and stored.scored_at >= found.scored_at):
        update |= {"placement_score": stored.placement_score, "scored_at": stored.scored_at}
    return found.model_copy(update=update)


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


def mark_gone(pool: PoolRecord, now: datetime) -> PoolRecord:
    """A pool discovery no longer finds: kept with its facts (a provider detached and attached again
    finds them), left out of `pool_options`, and expired by the ledger later."""
    return pool if pool.gone_since is not None else pool.model_copy(update={"gone_since": now})


def rebalance_fact(at: datetime, instance_id: str) -> Observation:
    """EC2's rebalance recommendation for an instance of the pool: a risk signal (`RISK_SOURCES`), so
    `available` stays True (the instance was not lost). Its time is the event's and its detail the
    instance, so the same notice delivered again is the same fact (`fold` keeps it once)."""
    return Observation(at=at, available=True, source="rebalance", detail=instance_id)


class HostPlacement(_Frozen):
    """Where an instance of a cluster is, as ECS describes its container instance: the capacity provider
    ECS associates it with (`capacityProviderName`; None when ECS names none), and its
    `ecs.instance-type` and `ecs.availability-zone` attributes (None when missing)."""

    cluster: str  # the cluster's name
    capacity_provider: str | None = None
    instance_type: str | None = None
    availability_zone: str | None = None


def host_pools(pools: Iterable[PoolRecord], host: HostPlacement) -> list[PoolRecord]:
    """The pool an instance is in: the one of its capacity provider, type and zone. When ECS names no
    provider, the spot pool of its type and zone, if only one provider has such a pool (a rebalance
    recommendation is for spot instances; two providers with the same type in a zone cannot be told
    apart, and a fact on the wrong pool would be worse than none). An empty list: no pool of the
    cluster's is known to hold it."""
    if host.instance_type is None or host.availability_zone is None:
        return []
    here = [
        p
        for p in pools
        if (p.instance_type, p.availability_zone) == (host.instance_type, host.availability_zone)
        and p.cluster == host.cluster
    ]
    if host.capacity_provider is not None:
        return [p for p in here if p.capacity_provider == host.capacity_provider]
    spot = [p for p in here if p.market == "spot"]
    return spot if len({p.capacity_provider for p in spot}) == 1 else []


def matching_pools(
    pools: Iterable[PoolRecord],
    auto_scaling_group: str,
    availability_zone: str | None = None,
    instance_type: str | None = None,
) -> list[PoolRecord]:
    """The pools of a group, narrowed to a zone and a type when known (an Auto Scaling launch failure
    names the group and the zone, not always the type)."""
    return [
        p
        for p in pools
        if p.auto_scaling_group == auto_scaling_group
        and availability_zone in (None, p.availability_zone)
        and instance_type in (None, p.instance_type)
    ]


# ====================================================================================== the policy
def availability_history(
    pool: PoolRecord,
    tick_hours: float,
    now: datetime,
    half_life_hours: float = 168.0,
    hold_hours: float = HOLD_HOURS,
) -> AvailabilityHistory:
    """The pool's history facts (`PoolRecord.history_facts`: risk signals and refused providers aside)
    as the planner's tick-based history, up to the tick of `now`.

    Ticks are `tick_hours` long, counted from the epoch. The rule: a fact holds from its own tick until
    the next fact, for at most `hold_hours`; within a tick the last fact counts. A tick no fact holds is
    unknown: at the first unknown tick after known ones the history is told `gap()` (the run's age is no
    longer known), and the unknown stretch still ages the counts (so a week-old outage weighs what a week
    of decay leaves of it). A pool whose newest fact is older than `hold_hours` thus ends in a gap."""
    from spotguard.domain.planner import AvailabilityHistory

    history = AvailabilityHistory(tick_hours, half_life_hours)
    facts = [o for o in pool.history_facts if o.at <= now]
    if not facts:
        return history
    tick = tick_hours * 3600.0
    hold = max(1, math.ceil(hold_hours * 3600.0 / tick - 1e-9))  # ticks a fact holds, its own included

    def index(at: datetime) -> int:
        return math.floor(at.timestamp() / tick)

    last_tick = index(now)
    # The state of each tick that has facts: the last fact in it.
    by_tick: dict[int, bool] = {}
    for o in facts:
        by_tick[index(o.at)] = o.available
    ticks = sorted(by_tick)
    position = ticks[0]
    for i, start in enumerate(ticks):
        if start > position:  # unknown ticks between the previous fact's hold and this one
            history.gap()
            _elapse(history, start - position)
        end = min(start + hold, ticks[i + 1] if i + 1 < len(ticks) else last_tick + 1, last_tick + 1)
        for _ in range(start, end):
            history.observe(by_tick[start])
        position = end
    if position <= last_tick:  # the newest fact no longer holds: the state now is not known
        history.gap()
        _elapse(history, last_tick + 1 - position)
    return history


def _elapse(history: AvailabilityHistory, ticks: int) -> None:
    """Age the history's counts over ticks nobody observed, as `observe` ages them each tick."""
    factor = history.decay**ticks
    history.exposure *= factor
    history.ends *= factor


def on_demand_price_or_penalty(pool: PoolRecord) -> float:
    """The pool's on-demand price, or for an unpriced pool the penalty price (see UNPRICED_PER_GPU)."""
    if pool.on_demand_price is not None:
        return pool.on_demand_price
    return UNPRICED_PER_GPU * max(pool.gpus_per_instance, 1)


def pool_options(
    pools: Iterable[PoolRecord],
    now: datetime,
    tick_hours: float,
    half_life_hours: float = 168.0,
    hold_hours: float = HOLD_HOURS,
) -> list[PoolOption]:
    """The planner's candidates: every spot pool still in the cluster, by name. A pool is available when
    it is not backed off (`unavailable_until` past) and its spot price is known; an unavailable one is
    still a candidate (its history and on-demand price count). On-demand pools are not candidates: the
    planner's on-demand choice is a spot pool's instance type (`CapacityDecision.instance_pool`), placed
    with `on_demand_pool`. A pool without history facts (`PoolRecord.history_facts`) has no history (the
    planner's prior and the placement score stand in)."""
    from spotguard.domain.planner import PoolOption

    options = []
    for p in sorted(pools, key=lambda p: p.name):
        if p.market != "spot" or p.gone_since is not None:
            continue
        on_demand = on_demand_price_or_penalty(p)
        options.append(
            PoolOption(
                name=p.name,
                gpus_per_instance=p.gpus_per_instance,
                spot_price=p.spot_price if p.spot_price is not None else on_demand,
                on_demand_price=on_demand,
                available=p.available_at(now) and p.spot_price is not None,
                history=availability_history(p, tick_hours, now, half_life_hours, hold_hours)
                if p.history_facts
                else None,
                placement_score=p.placement_score,
            )
        )
    return options


def on_demand_pool(
    pools: Iterable[PoolRecord], instance_type: str, now: datetime, zone: str | None = None
) -> PoolRecord | None:
    """Where to run on-demand in a type: an on-demand pool of that type not backed off, in `zone` if one
    is there, else the first by name (None: the cluster has no on-demand pool of that type)."""
    fits = sorted(
        (
            p
            for p in pools
            if p.market == "on-demand" and p.instance_type == instance_type and p.available_at(now)
        ),
        key=lambda p: (p.availability_zone != zone, p.name),
    )
    return fits[0] if fits else None


def by_name(pools: Iterable[PoolRecord]) -> Mapping[str, PoolRecord]:
    return {p.name: p for p in pools}
