"""The local stack's boot model: a pool's instances come from its Auto Scaling group and join the cluster
a boot's time after the group launched them, as on AWS (`LocalSystem(boot_seconds=...)`; off by default).

- **The groups launch.** When a pool's group's desired capacity rises (SpotGuard's SetDesiredCapacity,
  seen by a hook on its clients, or managed scaling below), moto launches the instances in its EC2
  (motopatch.py gives them the pool's type and spot lifecycle). Each boots: `boot_seconds` of the
  stack's clock after its launch, its ECS agent registers it as a container instance of the pool's
  provider, with the group's own instance id (so DescribeAutoScalingGroups, EC2 and ECS agree).
- **Instances leave.** An instance the group no longer holds (TerminateInstanceInAutoScalingGroup, a
  lower desired capacity) is gone: still booting, it never joins; joined, its host leaves the cluster.
- **Managed scaling.** A RunTask with a capacity provider strategy that no instance fits leaves its task
  PROVISIONING (GpuScheduler.manage_scaling), as ECS does for a provider with managed scaling. ECS sees
  it in its CapacityProviderReservation metric, published each minute, and its target tracking alarm
  raises the group's desired capacity: modelled as one look per provider `scale_out_seconds` after a
  task started waiting (and again each `scale_out_seconds` while tasks wait), raising the group by the
  instances the waiting tasks' GPUs need beyond those already booting for it. The task is placed when
  an instance that fits joins.

The figures (the boot of a GPU instance on the ECS GPU AMI, the managed scaling's reaction) and their
sources are in docs/local-stack.md. Nothing here runs on its own: `advance()` (LocalSystem.pump) does
what is due.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from spotguard_cli.emulator.gpucluster import GpuCluster, Host, PoolGroup
from spotguard_cli.emulator.gpuscheduler import GpuScheduler

# launch -> ECS agent registered, for a g5 on the ECS-optimized GPU AMI; an estimate (docs/local-stack.md)
BOOT_SECONDS = 180.0
# a task PROVISIONING -> its group's desired capacity raised: one CloudWatch period of ECS's
# CapacityProviderReservation metric; an estimate (docs/local-stack.md)
SCALE_OUT_SECONDS = 60.0
# the instances a group holds: those it is launching or has in service (not those it is terminating)
HELD = ("Pending", "Pending:Wait", "Pending:Proceed", "InService")


@dataclass(frozen=True)
class Boot:
    """An instance its group launched, on its way to joining the cluster."""

    instance_id: str
    pool: PoolGroup
    zone: str
    launched_at: datetime  # the stack's clock
    joins_at: datetime
    why: str  # what raised the group: "SpotGuard", "managed scaling", "pool host"


class BootModel:
    """Instances from the pools' Auto Scaling groups, each joining the cluster after its boot."""

    def __init__(
        self,
        cluster: GpuCluster,
        scheduler: GpuScheduler,
        autoscaling: Any,
        pools: Sequence[PoolGroup],
        clock: Callable[[], datetime],
        boot_seconds: float = BOOT_SECONDS,
        scale_out_seconds: float = SCALE_OUT_SECONDS,
    ) -> None:
        if boot_seconds < 0 or scale_out_seconds < 0:
            raise ValueError("the boot and the scale-out take no less than 0 seconds")
        self.cluster, self.scheduler, self.autoscaling = cluster, scheduler, autoscaling
        self.pools = {p.group: p for p in pools}
        self.providers = {p.capacity_provider: p for p in pools}
        self.clock = clock
        self.boot_seconds, self.scale_out_seconds = boot_seconds, scale_out_seconds
        self.booting: dict[str, Boot] = {}  # instance id -> its boot, until it joins or is gone
        self.joined: dict[str, tuple[Host, Boot]] = {}  # instance id -> its host, while in the group
        self.launched: list[Boot] = []  # every instance a group launched, in order
        self.left: list[tuple[datetime, str, bool]] = []  # (when, instance, had it joined)
        self._gone: list[Host] = []  # joined hosts the groups no longer hold, for advance()
        self._looks: dict[str, datetime] = {}  # provider -> managed scaling's next look
        self._seen: set[str] = set()  # every instance id a group has held
        self._lock = threading.RLock()

    def install(self) -> None:
        """Follow SpotGuard's own Auto Scaling calls (the functions run in this process)."""
        from spotguard.adapters import clients

        for op in ("SetDesiredCapacity", "TerminateInstanceInAutoScalingGroup"):
            clients.on_event(f"after-call.autoscaling.{op}", self._after_call)

    # --------------------------------------------------------------------------------- the groups
    def launch(
        self, capacity_provider: str, count: int = 1, booted: bool = False, why: str = ""
    ) -> list[Boot]:
        """The provider's group's desired capacity raised by `count` (to its MaxSize at most); its new
        instances boot (`booted`: they join at the next `advance`, as instances running before the
        scenario began). The instances launched."""
        pool = self.providers[capacity_provider]
        with self._lock:
            g = self._groups([pool.group])[0]
            desired = min(int(g["DesiredCapacity"]) + count, int(g["MaxSize"]))
            if desired > int(g["DesiredCapacity"]):
                self.autoscaling.set_desired_capacity(
                    AutoScalingGroupName=pool.group, DesiredCapacity=desired, HonorCooldown=False
                )
            return self.sync(booted=booted, why=why or "pool host")

    def sync(self, booted: bool = False, why: str = "SpotGuard") -> list[Boot]:
        """Read the groups: an instance new to them starts its boot, one they no longer hold is gone.
        The boots started."""
        with self._lock:
            now = self.clock()
            joins_at = now if booted else now + timedelta(seconds=self.boot_seconds)
            started: list[Boot] = []
            for g in self._groups(list(self.pools)):
                pool = self.pools[g["AutoScalingGroupName"]]
                held = {
                    i["InstanceId"]: i for i in g.get("Instances") or [] if i.get("LifecycleState") in HELD
                }
                for iid, inst in held.items():
                    if iid in self._seen:
                        continue
                    self._seen.add(iid)
                    zone = inst.get("AvailabilityZone") or pool.zones[0]
                    boot = Boot(iid, pool, zone, now, joins_at, why)
                    self.booting[iid] = boot
                    self.launched.append(boot)
                    started.append(boot)
                for iid in [i for i, b in self.booting.items() if b.pool is pool and i not in held]:
                    del self.booting[iid]
                    self.left.append((now, iid, False))
                for iid in [i for i, (_, b) in self.joined.items() if b.pool is pool and i not in held]:
                    host, _ = self.joined.pop(iid)
                    self._gone.append(host)
                    self.left.append((now, iid, True))
            return started

    def reclaim(self, host: Host) -> None:
        """Spot took a group's instance back: the group terminates it without lowering its desired
        capacity, and launches a replacement to hold that capacity, as Auto Scaling does."""
        with self._lock:
            if host.instance_id not in self.joined:
                return
            # moto's group launches the replacement itself when the desired capacity is kept
            self.autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=host.instance_id, ShouldDecrementDesiredCapacity=False
            )
            self.sync(why="replacement")  # the host is gone (advance() hands it over), the new one boots

    # -------------------------------------------------------------------------------- managed scaling
    def wanted(self, task: dict[str, Any]) -> None:
        """A task went PROVISIONING for its capacity provider: managed scaling looks a period later."""
        provider = task.get("capacityProviderName") or ""
        with self._lock:
            if provider in self.providers and provider not in self._looks:
                self._looks[provider] = self.clock() + timedelta(seconds=self.scale_out_seconds)

    def _look(self, provider: str) -> None:
        """Managed scaling's look at a provider: as many instances more as its waiting tasks' GPUs need
        beyond what is booting for it; another look a period later while tasks wait."""
        from spotguard.domain.prices import gpus_of

        pool = self.providers[provider]
        waiting = [w for w in self.scheduler.waiting.values() if _first_provider(w.request) == provider]
        if not waiting:
            return
        per_instance = gpus_of(pool.instance_type) or 1
        coming = per_instance * sum(1 for b in self.booting.values() if b.pool is pool)
        deficit = sum(w.need for w in waiting) - coming
        if deficit > 0:
            self.launch(provider, math.ceil(deficit / per_instance), why="managed scaling")
        self._looks[provider] = self.clock() + timedelta(seconds=self.scale_out_seconds)

    # --------------------------------------------------------------------------------------- time
    def advance(self) -> tuple[list[tuple[Host, Boot]], list[Host]]:
        """What is due now: managed scaling's looks, then the boots that end (each instance registered
        as a container instance of its pool's provider). (the hosts that joined with their boots, the
        joined hosts the groups no longer hold, to be taken out of the cluster)."""
        with self._lock:
            now = self.clock()
            for provider, at in list(self._looks.items()):
                if at <= now:
                    del self._looks[provider]
                    self._look(provider)
            joined: list[tuple[Host, Boot]] = []
            for iid, boot in sorted(self.booting.items(), key=lambda kv: kv[1].joins_at):
                if boot.joins_at > now:
                    continue
                del self.booting[iid]
                host = self.cluster.register_host(
                    iid, boot.pool.instance_type, boot.zone, boot.pool.capacity_provider
                )
                self.joined[iid] = (host, boot)
                joined.append((host, boot))
            gone, self._gone = self._gone, []
            return joined, gone

    def _after_call(self, parsed: dict[str, Any], **_: Any) -> None:
        if "Error" not in parsed:
            self.sync()

    def _groups(self, names: list[str]) -> list[dict[str, Any]]:
        groups = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=names)
        return list(groups.get("AutoScalingGroups") or [])


def _first_provider(request: dict[str, Any]) -> str:
    """The provider ECS scales for a task: the first of its strategy (SpotGuard names one)."""
    strategy = request.get("capacityProviderStrategy") or []
    return str(strategy[0]["capacityProvider"]) if strategy else ""
