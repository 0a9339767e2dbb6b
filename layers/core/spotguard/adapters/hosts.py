"""EC2: what an attempt runs on (instance, type, zone, spot or on-demand) and what it costs per hour."""

from __future__ import annotations

import threading
from typing import Any

from spotguard.domain import clock
from spotguard.domain.jobs.replies import HostInfo
from spotguard.domain.prices import gpus_of, on_demand_price

SPOT_PRICE_TTL_SECONDS = 3600


class Ec2Hosts:
    def __init__(self, ecs: Any, ec2: Any) -> None:
        self.ecs, self.ec2 = ecs, ec2
        self._spot: dict[tuple[str, str], tuple[float, float | None]] = {}
        self._gpus: dict[str, int | None] = {}
        self._lock = threading.Lock()

    def facts(self, cluster: str, container_instance_arn: str) -> HostInfo | None:
        resp = self.ecs.describe_container_instances(
            cluster=cluster, containerInstances=[container_instance_arn]
        )
        found = resp.get("containerInstances") or []
        if not found or not found[0].get("ec2InstanceId"):
            return None  # Fargate or gone
        instance_id = str(found[0]["ec2InstanceId"])
        reservations = self.ec2.describe_instances(InstanceIds=[instance_id]).get("Reservations") or []
        instances = [i for r in reservations for i in r.get("Instances", [])]
        if not instances:
            return HostInfo(instance_id=instance_id)
        inst = instances[0]
        itype = inst.get("InstanceType")
        az = (inst.get("Placement") or {}).get("AvailabilityZone")
        lifecycle = "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand"
        price = self._spot_price(itype, az) if lifecycle == "spot" and itype and az else None
        if price is None and itype and lifecycle == "on-demand":
            price = on_demand_price(itype)
        return HostInfo(
            instance_id=instance_id,
            instance_type=itype,
            availability_zone=az,
            lifecycle=lifecycle,
            instance_price=price,
            instance_gpus=self._instance_gpus(itype) if itype else None,
            private_ip=inst.get("PrivateIpAddress"),
        )

    def _spot_price(self, instance_type: str, az: str) -> float | None:
        key = (instance_type, az)
        with self._lock:
            cached = self._spot.get(key)
        if cached and clock.monotonic() - cached[0] < SPOT_PRICE_TTL_SECONDS:
            return cached[1]
        resp = self.ec2.describe_spot_price_history(
            InstanceTypes=[instance_type],
            AvailabilityZone=az,
            ProductDescriptions=["Linux/UNIX"],
            MaxResults=1,
        )
        history = resp.get("SpotPriceHistory") or []
        price = float(history[0]["SpotPrice"]) if history else None
        with self._lock:
            self._spot[key] = (clock.monotonic(), price)
        return price

    def _instance_gpus(self, instance_type: str) -> int | None:
        known = gpus_of(instance_type)
        if known is not None:
            return known
        with self._lock:
            if instance_type in self._gpus:
                return self._gpus[instance_type]
        resp = self.ec2.describe_instance_types(InstanceTypes=[instance_type])
        types = resp.get("InstanceTypes") or []
        gpus = sum(g.get("Count", 0) for g in (types[0].get("GpuInfo") or {}).get("Gpus", [])) if types else 0
        with self._lock:
            self._gpus[instance_type] = gpus or None
        return gpus or None
