"""Discovery: the pools of a cluster, read from its capacity providers as the AWS APIs describe them
(the parts of their answers it reads are in shapes.py).

Nothing is configured for the common cluster (spot and on-demand groups over a few types and zones, each
a capacity provider): `discover_pools` reads the cluster's providers, their groups, launch templates,
subnets and instance types, and makes one `PoolRecord` per (provider, type, zone). A provider tagged
`spotguard:pool=ignore` is left out; FARGATE and FARGATE_SPOT are never pools. When a provider spans
several types (or zones), RunTask must narrow it to the pool's: `constrain_type` / `constrain_zone` say
so, and `domain.jobs.placement.placement_params` gives the strategy and constraints of a decision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

from spotguard.domain.pools.facts import without_facts_ahead
from spotguard.domain.pools.records import Frozen, PoolMarket, PoolRecord
from spotguard.domain.pools.shapes import (
    AutoScalingGroup,
    CapacityProvider,
    InstanceTypeInfo,
    LaunchTemplateSpec,
    Subnet,
    TemplateData,
    TemplateVersion,
)
from spotguard.domain.prices import ON_DEMAND_PRICES, gpus_of

IGNORE_TAG = "spotguard:pool"  # value "ignore" leaves the capacity provider out
PRICE_TAG = "spotguard:on-demand-price"
NOT_POOLS = frozenset({"FARGATE", "FARGATE_SPOT"})


class ClusterDescription(Frozen):
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


class Skipped(Frozen):
    capacity_provider: str
    reason: str


class Discovery(Frozen):
    """What discovery found: the pools, the providers it left out and why, and whether it saw everything
    (if not, a stored pool it did not find is not taken for gone)."""

    cluster: str
    pools: tuple[PoolRecord, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    complete: bool = True


class Refreshed(Frozen):
    """A cluster's pools after a refresh, and what of it failed: one line per call that failed and what
    was lost with it (e.g. one type's spot price: its pools keep the price they had, or none). The rest
    of the refresh is kept."""

    cluster: str
    pools: tuple[PoolRecord, ...] = ()
    errors: tuple[str, ...] = ()


# ======================================================================================== discovery
def group_market(group: AutoScalingGroup, template: TemplateData | None) -> PoolMarket:
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
                        max_instances=group.max_size,
                        on_demand_price=price,
                        on_demand_price_source=source,
                        discovered_at=now,
                    )
                )
    return Discovery(cluster=described.cluster, pools=tuple(pools), skipped=tuple(skipped), complete=complete)


def _types_and_market(
    group: AutoScalingGroup, versions: Sequence[TemplateVersion]
) -> tuple[list[str], PoolMarket, str | None]:
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


def mark_gone(pool: PoolRecord, now: datetime) -> PoolRecord:
    """A pool discovery no longer finds: kept with its facts (a provider detached and attached again
    finds them), left out of `pool_options`, and expired by the ledger later."""
    return pool if pool.gone_since is not None else pool.model_copy(update={"gone_since": now})
