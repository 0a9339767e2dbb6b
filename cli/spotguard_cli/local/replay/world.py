"""The replay's world: the local stack whose spot pools follow availability traces.

One spot pool per trace (a capacity provider of p3.2xlarge instances, 1 V100 each, in a zone of its own:
the instance type the traces were measured on) and an on-demand pool over the first zone that never runs
out. Each pool keeps one instance per job while spot can be had, as an Auto Scaling group sized for the
jobs would. At each trace tick (`tick`):

- spot there, and it was not: the group launches its instances again (EC2 Instance Launch Successful
  for each, on the bus) and RunTask can place tasks in the pool;
- spot gone: RunTask finds no instance there, the group's launches fail (EC2 Instance Launch
  Unsuccessful, on the bus, at every tick the trace says so, as a group that keeps trying does), and its
  instances, warned two minutes before the tick (`warn`: the EC2 Spot Instance Interruption Warning),
  are taken away at the tick (`take_away`): a task still running there dies with them.

Two minutes of the replay's clock can be a fraction of a wall-clock second, less than a task needs to
commit its checkpoint and exit here; so an instance is never taken away less than `warn_floor_seconds`
(wall clock) after its warning. The spot price is the one the simulator uses (DescribeSpotPriceHistory
is answered with it); the on-demand price is p3.2xlarge's from the package's table, the same figure.
moto's catalogue of instance types has no p3.2xlarge: DescribeInstanceTypes is answered for it as EC2
answers (one NVIDIA V100, 8 vCPUs).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from spotguard_cli.emulator.gpucluster import Host, PoolGroup
from spotguard_cli.emulator.inject import launch_successful, launch_unsuccessful
from spotguard_cli.emulator.system import LocalSystem
from spotguard_cli.simulator import Prices, Trace

INSTANCE_TYPE = "p3.2xlarge"  # 1 V100: what the Can't Be Late traces were measured on
ZONES = tuple(f"us-east-1{z}" for z in "abcdef")  # one per spot pool: at most six traces
ON_DEMAND = "replay-on-demand"
WARNING = timedelta(minutes=2)
# Tick 0 of every trace: a Monday at midnight (any time on a tick boundary of the planner would do).
EPOCH = datetime(2026, 1, 5, tzinfo=UTC)


def provider_name(index: int, trace: Trace) -> str:
    """The capacity provider of the trace's pool: `spot-<n>-<trace name>` (letters, digits, - and _)."""
    return f"spot-{index + 1}-" + re.sub(r"[^A-Za-z0-9_-]", "-", trace.name)[:200]


@dataclass
class TracePool:
    trace: Trace
    group: PoolGroup
    hosts: list[Host] = field(default_factory=list)  # its instances, not warned
    doomed: list[tuple[Host, float]] = field(default_factory=list)  # warned: (instance, wall clock)
    available: bool | None = None  # the state applied so far (None: no tick yet)


class ReplayWorld:
    def __init__(
        self,
        system: LocalSystem,
        traces: list[Trace],
        instances_per_pool: int,
        prices: Prices,
        warn_floor_seconds: float = 2.0,
    ) -> None:
        if not 1 <= len(traces) <= len(ZONES):
            raise ValueError(f"a replay takes 1 to {len(ZONES)} traces")
        self.system, self.prices = system, prices
        self.instances = instances_per_pool
        self.warn_floor = warn_floor_seconds
        self.gap = timedelta(hours=traces[0].gap_hours)
        self.pools = [
            TracePool(
                t,
                PoolGroup(
                    provider_name(i, t), f"{provider_name(i, t)}-group", INSTANCE_TYPE, (ZONES[i],), True
                ),
            )
            for i, t in enumerate(traces)
        ]
        self.on_demand = PoolGroup(ON_DEMAND, f"{ON_DEMAND}-group", INSTANCE_TYPE, (ZONES[0],), spot=False)
        self.counts = {"warnings": 0, "taken_away": 0, "launch_failures": 0, "launches": 0}

    def build(self) -> None:
        """The pools' groups and capacity providers, and the on-demand pool's instances; EC2's answers
        that moto cannot give (the replay's spot price, p3.2xlarge's description)."""
        from spotguard.adapters import clients

        clients.on_event("before-call.ec2.DescribeSpotPriceHistory", self._spot_prices)
        clients.on_event("before-call.ec2.DescribeInstanceTypes", describe_p3)
        self.system.add_pools([p.group for p in self.pools] + [self.on_demand])
        for _ in range(self.instances):
            self.system.add_pool_host(ON_DEMAND)

    def at(self, tick: int) -> datetime:
        return EPOCH + self.gap * tick

    # ----------------------------------------------------------------------------- the trace's ticks
    def tick(self, index: int) -> None:
        """Make every pool what its trace says for tick `index` (the clock is at the tick's start)."""
        for pool in self.pools:
            now_available = pool.trace.available[index]
            if now_available and pool.available is not True:
                self.system.scheduler.short_providers.discard(pool.group.capacity_provider)
                for _ in range(self.instances - len(pool.hosts)):
                    host = self.system.add_pool_host(pool.group.capacity_provider)
                    pool.hosts.append(host)
                    self._put(launch_successful, pool, host.instance_id)
                    self.counts["launches"] += 1
            elif not now_available:
                if pool.available is not False:
                    self.system.scheduler.short_providers.add(pool.group.capacity_provider)
                self._put(launch_unsuccessful, pool)
                self.counts["launch_failures"] += 1
            pool.available = now_available

    def warn(self, index: int) -> list[Host]:
        """The interruption warning for every instance of the pools whose spot ends at tick `index`
        (the clock is two minutes before it). The instances warned."""
        warned = []
        for pool in self.pools:
            if index > 0 and pool.trace.available[index - 1] and not pool.trace.available[index]:
                for host in pool.hosts:
                    self.system.notice("spot-interruption", host.instance_id)
                    warned.append(host)
                    pool.doomed.append((host, time.monotonic()))
                self.counts["warnings"] += len(pool.hosts)
                pool.hosts.clear()  # they are drained: spot coming back needs new instances
        return warned

    def take_away(self) -> float:
        """Take away every warned instance whose spot is gone (its tick has come); the wall-clock seconds
        to wait for those warned less than `warn_floor_seconds` ago (they are kept until then). A pool
        that lost spot with no warning (the first tick after a skip) loses its instances at once."""
        wait = 0.0
        for pool in self.pools:
            if pool.available is False and pool.hosts:
                pool.doomed += [(host, 0.0) for host in pool.hosts]
                pool.hosts.clear()
            kept = []
            for host, warned_at in pool.doomed:
                since = time.monotonic() - warned_at
                if since < self.warn_floor:
                    wait = max(wait, self.warn_floor - since)
                    kept.append((host, warned_at))
                    continue
                self.system.take_away(host)
                self.counts["taken_away"] += 1
            pool.doomed = kept
        return wait

    def _put(self, make: Any, pool: TracePool, *instance: str) -> None:
        zone = pool.group.zones[0]
        stack = self.system.stack
        self.system.put(
            make(pool.group.group, zone, *instance, self.system.clock.now(), stack.region, stack.account)
        )

    def _spot_prices(self, params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
        return spot_price_history(self.system.clock.now(), self.prices.spot, len(self.pools))


def spot_price_history(now: datetime, price: float, pools: int) -> tuple[Any, dict[str, Any]]:
    """DescribeSpotPriceHistory, answered with the replay's spot price for every pool's zone."""
    from botocore.awsrequest import AWSResponse

    stamp = now - timedelta(hours=1)
    history = [
        {
            "AvailabilityZone": zone,
            "InstanceType": INSTANCE_TYPE,
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": f"{price:.6f}",
            "Timestamp": stamp,
        }
        for zone in ZONES[:pools]
    ]
    return AWSResponse("local://ec2", 200, {}, None), {"SpotPriceHistory": history, "NextToken": ""}


P3_2XLARGE = {
    "InstanceType": INSTANCE_TYPE,
    "VCpuInfo": {"DefaultVCpus": 8},
    "MemoryInfo": {"SizeInMiB": 62464},
    "GpuInfo": {
        "Gpus": [{"Name": "V100", "Manufacturer": "NVIDIA", "Count": 1, "MemoryInfo": {"SizeInMiB": 16384}}],
        "TotalGpuMemoryInMiB": 16384,
    },
}


def describe_p3(params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]] | None:
    """DescribeInstanceTypes for p3.2xlarge alone (what SpotGuard's discovery asks here): EC2's answer."""
    from urllib.parse import parse_qs

    from botocore.awsrequest import AWSResponse

    body = params.get("body") or ""
    fields = body if isinstance(body, dict) else parse_qs(body if isinstance(body, str) else body.decode())
    asked = {
        str(v if isinstance(v, str) else v[0]) for k, v in fields.items() if k.startswith("InstanceType.")
    }
    if asked != {INSTANCE_TYPE}:
        return None
    return AWSResponse("local://ec2", 200, {}, None), {"InstanceTypes": [P3_2XLARGE], "NextToken": ""}
