"""The cluster's pools as ECS, Auto Scaling and EC2 describe them, and their spot prices and scores.

`PoolDiscovery.describe` reads what `domain.pools.discover_pools` needs, following every API's pages:
DescribeClusters (the providers' names), DescribeCapacityProviders (with their tags), DescribeAutoScaling
Groups, DescribeLaunchTemplateVersions (only for a group that names no type in overrides),
DescribeSubnets (the zones of the groups' VPCZoneIdentifier) and DescribeInstanceTypes (GPUs per
instance). `spot_prices` reads the newest spot price per type and zone; `placement_scores` asks EC2's
spot placement score, which is rate limited (the caller caches it) and never fatal.

The clients are those of adapters/clients.py (botocore's standard retry mode): nothing here retries.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from spotguard.domain import clock
from spotguard.domain.pools import (
    NOT_POOLS,
    AutoScalingGroup,
    CapacityProvider,
    ClusterDescription,
    Discovery,
    InstanceTypeInfo,
    LaunchTemplateSpec,
    SpotQuote,
    Subnet,
    TemplateVersion,
    discover_pools,
)

log = logging.getLogger(__name__)

# Per-request limits of the APIs (names per call).
CAPACITY_PROVIDERS_PER_CALL = 100
GROUPS_PER_CALL = 50
SUBNETS_PER_CALL = 200
INSTANCE_TYPES_PER_CALL = 100
TEMPLATE_NOT_FOUND = {
    "InvalidLaunchTemplateId.NotFound",
    "InvalidLaunchTemplateName.NotFoundException",
    "InvalidLaunchTemplateId.VersionNotFound",
    "InvalidLaunchTemplateId.Malformed",
}


def _chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


class PoolDiscovery:
    def __init__(self, ecs: Any, autoscaling: Any, ec2: Any) -> None:
        self.ecs, self.autoscaling, self.ec2 = ecs, autoscaling, ec2

    # ----------------------------------------------------------------------------------- discovery
    def discover(self, cluster: str, now: datetime | None = None) -> Discovery:
        return discover_pools(self.describe(cluster), now or clock.now())

    def describe(self, cluster: str) -> ClusterDescription:
        """Everything discovery needs about a cluster (given by name or ARN). A cluster ECS does not know
        has no pools (and its discovery is complete: its stored pools are gone)."""
        failures: list[str] = []
        answer = self.ecs.describe_clusters(clusters=[cluster])
        found = answer.get("clusters") or []
        if not found:
            reasons = [f.get("reason", "") for f in answer.get("failures") or []]
            log.warning("cluster %s not found: %s", cluster, ", ".join(reasons) or "no answer")
            return ClusterDescription(cluster=cluster.rsplit("/", 1)[-1])
        name = str(found[0].get("clusterName") or cluster.rsplit("/", 1)[-1])
        names = [n for n in found[0].get("capacityProviders") or [] if n not in NOT_POOLS]
        providers = self._capacity_providers(names, failures)
        group_names = list(dict.fromkeys(p.group_name for p in providers if p.group_name))
        groups = self._groups(group_names)
        templates = self._templates([t for g in groups for t in g.templates()], failures)
        subnets = self._subnets(list(dict.fromkeys(s for g in groups for s in g.subnet_ids)))
        types = {o.instance_type for g in groups if g.mixed for o in g.mixed.launch_template.overrides}
        types |= {v.data.instance_type for v in templates}
        instance_types = self._instance_types(sorted(t for t in types if t))
        return ClusterDescription(
            cluster=name,
            capacity_providers=tuple(providers),
            auto_scaling_groups=tuple(groups),
            launch_templates=tuple(templates),
            subnets=tuple(subnets),
            instance_types=tuple(instance_types),
            failures=tuple(failures),
        )

    def _capacity_providers(self, names: Sequence[str], failures: list[str]) -> list[CapacityProvider]:
        providers: list[CapacityProvider] = []
        for chunk in _chunks(names, CAPACITY_PROVIDERS_PER_CALL):
            request: dict[str, Any] = {"capacityProviders": chunk, "include": ["TAGS"]}
            while True:  # DescribeCapacityProviders pages by nextToken and botocore has no paginator for it
                page = self.ecs.describe_capacity_providers(**request)
                providers += [CapacityProvider.model_validate(p) for p in page.get("capacityProviders") or []]
                failures += [
                    f"capacity provider {f.get('arn', '?')}: {f.get('reason', '?')}"
                    for f in page.get("failures") or []
                ]
                if not page.get("nextToken"):
                    break
                request["nextToken"] = page["nextToken"]
        return providers

    def _groups(self, names: Sequence[str]) -> list[AutoScalingGroup]:
        paginator = self.autoscaling.get_paginator("describe_auto_scaling_groups")
        return [
            AutoScalingGroup.model_validate(g)
            for chunk in _chunks(names, GROUPS_PER_CALL)
            for page in paginator.paginate(AutoScalingGroupNames=chunk)
            for g in page.get("AutoScalingGroups") or []
        ]

    def _templates(self, specs: Sequence[LaunchTemplateSpec], failures: list[str]) -> list[TemplateVersion]:
        """The versions the groups launch from, one request per distinct (template, version). A template
        EC2 no longer has is a failure (its group has no pool), not an error."""
        paginator = self.ec2.get_paginator("describe_launch_template_versions")
        found: list[TemplateVersion] = []
        for (by, which), version in dict.fromkeys((s.ref, s.version or "$Default") for s in specs):
            request = {
                "LaunchTemplateId" if by == "id" else "LaunchTemplateName": which,
                "Versions": [version],
            }
            try:
                found += [
                    TemplateVersion.model_validate(v)
                    for page in paginator.paginate(**request)
                    for v in page.get("LaunchTemplateVersions") or []
                ]
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in TEMPLATE_NOT_FOUND:
                    raise
                failures.append(f"launch template {which} version {version}: not found")
        return found

    def _subnets(self, ids: Sequence[str]) -> list[Subnet]:
        paginator = self.ec2.get_paginator("describe_subnets")
        return [
            Subnet.model_validate(s)
            for chunk in _chunks(ids, SUBNETS_PER_CALL)
            for page in paginator.paginate(SubnetIds=chunk)
            for s in page.get("Subnets") or []
        ]

    def _instance_types(self, types: Sequence[str]) -> list[InstanceTypeInfo]:
        paginator = self.ec2.get_paginator("describe_instance_types")
        return [
            InstanceTypeInfo.model_validate(t)
            for chunk in _chunks(types, INSTANCE_TYPES_PER_CALL)
            for page in paginator.paginate(InstanceTypes=chunk)
            for t in page.get("InstanceTypes") or []
        ]

    # -------------------------------------------------------------------------------- spot prices
    def spot_prices(
        self, instance_types: Collection[str], zones: Collection[str], now: datetime | None = None
    ) -> list[SpotQuote]:
        """The newest Linux spot price of each type in each zone asked for: DescribeSpotPriceHistory from
        now, which answers the price in effect now. A pair EC2 has no price for (a type not offered in
        a zone) comes back with price None, so that it is not asked again until the next refresh."""
        at = now or clock.now()
        if not instance_types or not zones:
            return []
        newest: dict[tuple[str, str], tuple[datetime, float]] = {}
        pages = self.ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=sorted(instance_types), ProductDescriptions=["Linux/UNIX"], StartTime=at
        )
        for page in pages:
            for entry in page.get("SpotPriceHistory") or []:
                if not str(entry.get("ProductDescription", "")).startswith("Linux/UNIX"):
                    continue
                pair = (str(entry.get("InstanceType")), str(entry.get("AvailabilityZone")))
                stamp = entry.get("Timestamp") or at
                if pair[1] in zones and (pair not in newest or stamp > newest[pair][0]):
                    newest[pair] = (stamp, float(entry["SpotPrice"]))
        quotes = []
        for itype in sorted(instance_types):
            for zone in sorted(zones):
                stamp, price = newest.get((itype, zone), (None, None))
                quotes.append(
                    SpotQuote(
                        instance_type=itype,
                        availability_zone=zone,
                        price=price,
                        at=at,
                        since=stamp.astimezone(UTC) if stamp else None,
                    )
                )
        return quotes

    # --------------------------------------------------------------------------- placement scores
    def placement_scores(self, instance_types: Collection[str], region: str) -> dict[str, int]:
        """The spot placement score (1..10) of a set of types, per availability zone id (e.g. use1-az4),
        for one instance in one zone. Rate limited by EC2: any error is logged and means no score."""
        try:
            pages = self.ec2.get_paginator("get_spot_placement_scores").paginate(
                InstanceTypes=sorted(instance_types),
                TargetCapacity=1,
                SingleAvailabilityZone=True,
                RegionNames=[region],
            )
            scores: dict[str, int] = {}
            for page in pages:
                for s in page.get("SpotPlacementScores") or []:
                    if s.get("AvailabilityZoneId") and s.get("Score") is not None:
                        scores[str(s["AvailabilityZoneId"])] = int(s["Score"])
            return scores
        except (ClientError, BotoCoreError) as exc:
            log.warning(
                "no spot placement score for %s in %s: %s", ",".join(sorted(instance_types)), region, exc
            )
            return {}
