"""`SystemPools`: the local system's capacity, a base of `LocalSystem` (system.py): its pools (capacity
providers, each an Auto Scaling group), their instances joining the cluster and taken away, a pool's
capacity shortage and its end, and with the boot model (boot.py) the instances its groups launch and the
tasks that wait PROVISIONING for them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spotguard_cli.emulator.boot import BootModel
from spotguard_cli.emulator.gpucluster import PoolGroup
from spotguard_cli.emulator.gpuscheduler import TaskStates
from spotguard_cli.emulator.inject import (
    container_instance_event,
    launch_successful,
    launch_unsuccessful,
    task_event,
)

if TYPE_CHECKING:
    from spotguard_cli.emulator.gpucluster import GpuCluster, Host
    from spotguard_cli.emulator.gpuscheduler import GpuScheduler
    from spotguard_cli.emulator.runner import TaskRunner
    from spotguard_cli.emulator.scaledclock import ScaledClock
    from spotguard_cli.emulator.stack import DeployedStack

# The local cluster's pools, as examples/gpu-cluster makes them: two spot capacity providers in different
# zones and an on-demand one over both.
LOCAL_POOLS = [
    PoolGroup("gpu-spot-a", "gpu-spot-a-group", "g5.xlarge", ("us-east-1a",), spot=True),
    PoolGroup("gpu-spot-b", "gpu-spot-b-group", "g5.xlarge", ("us-east-1b",), spot=True),
    PoolGroup("gpu-od", "gpu-od-group", "g5.xlarge", ("us-east-1a", "us-east-1b"), spot=False),
]


class SystemPools:
    """The pools and their instances, on what `LocalSystem.__init__` sets; what they do goes on the bus
    through `LocalSystem.put`, and is said through `on_change`."""

    stack: DeployedStack
    cluster: GpuCluster
    scheduler: GpuScheduler
    runner: TaskRunner
    clock: ScaledClock
    on_change: Callable[[str], None]
    boot_seconds: float | None
    scale_out_seconds: float
    boot: BootModel | None
    short: dict[str, float]  # capacity provider -> wall-clock end of its shortage
    pools: dict[str, PoolGroup]

    # ---------------------------------------------------------------------------------------- world
    def add_host(self, instance_type: str = "g5.xlarge", zone: str = "us-east-1a") -> Host:
        """A simulated GPU spot instance joins the cluster (and ECS says so on the bus)."""
        host = self.cluster.add_host(instance_type, zone)
        self.put(container_instance_event(self.cluster.describe_host(host)))
        return host

    def add_pools(self, pools: list[PoolGroup] | None = None) -> None:
        """The cluster's capacity providers (LOCAL_POOLS by default), each an Auto Scaling group that
        SpotGuard discovers; add their instances with `add_pool_host`."""
        self.pools = {p.capacity_provider: p for p in pools or LOCAL_POOLS}
        self.cluster.add_pools(self.stack.client("autoscaling"), list(self.pools.values()))
        if self.boot_seconds is not None:
            self.boot = BootModel(
                self.cluster,
                self.scheduler,
                self.stack.client("autoscaling"),
                list(self.pools.values()),
                self.clock.now,
                boot_seconds=self.boot_seconds,
                scale_out_seconds=self.scale_out_seconds,
            )
            self.boot.install()
            self.scheduler.manage_scaling(TaskStates(self.stack.endpoint, self.stack.region), self._wanted)

    def add_pool_host(self, capacity_provider: str, zone: str | None = None) -> Host:
        """An instance of a pool's Auto Scaling group joins the cluster. With the boot model, its group
        launches it (its desired capacity one higher, the zone the group's: moto's, its first subnet's)
        and it joins at once, booted already, as an instance running before the scenario began."""
        p = self.pools[capacity_provider]
        if self.boot is not None:
            if zone not in (None, p.zones[0]):
                raise ValueError(f"with the boot model, {p.group} launches in {p.zones[0]}, not {zone}")
            (boot,) = self.boot.launch(capacity_provider, 1, booted=True, why="pool host")
            self._advance_boots()
            return self.boot.joined[boot.instance_id][0]
        host = self.cluster.add_host(p.instance_type, zone or p.zones[0], capacity_provider, spot=p.spot)
        self.put(container_instance_event(self.cluster.describe_host(host)))
        return host

    def take_away(self, host: Host) -> None:
        """Spot takes the instance back: the processes of its tasks end at once (a task still running
        there then stops with exit code 137), no task is placed on it again, and it leaves the cluster.
        With the boot model, an instance of a group is terminated there, and the group launches its
        replacement (which boots)."""
        if self.boot is not None and host.instance_id in self.boot.joined:
            self.boot.reclaim(host)
            self._advance_boots()
            return
        self._leave(host, "taken away")

    def _leave(self, host: Host, why: str) -> None:
        for arn, where in list(self.scheduler.placed.items()):
            if where == host.container_instance_arn:
                self.runner.kill(arn)
        self.scheduler.status[host.container_instance_arn] = "INACTIVE"
        self.cluster.remove_host(host)
        self.on_change(f"  {host.instance_id} ({host.capacity_provider}) {why}")

    def capacity_shortage(self, capacity_provider: str, seconds: float) -> dict[str, Any]:
        """The pool's Auto Scaling group can launch nothing for `seconds` (wall clock): RunTask finds no
        new instance there (the scheduler refuses the provider), and Auto Scaling says so on the bus
        (EC2 Instance Launch Unsuccessful, for each of its zones). When it ends, the group launches an
        instance again (`pump` adds it, and puts EC2 Instance Launch Successful on the bus). The first
        event put is returned."""
        p = self.pools[capacity_provider]
        self.short[capacity_provider] = time.monotonic() + seconds
        self.scheduler.short_providers.add(capacity_provider)
        events = [
            launch_unsuccessful(p.group, zone, self.clock.now(), self.stack.region, self.stack.account)
            for zone in p.zones
        ]
        for e in events:
            self.put(e)
        return events[0]

    def capacity_back_in(self, capacity_provider: str, seconds: float) -> None:
        """End a pool's shortage `seconds` (wall clock) from now."""
        if capacity_provider in self.short:
            self.short[capacity_provider] = time.monotonic() + seconds

    def _end_shortages(self) -> None:
        """The pools whose shortage is over: Auto Scaling launches an instance in each, and says so."""
        for provider, until in list(self.short.items()):
            if time.monotonic() >= until:  # the shortage is over: Auto Scaling launches an instance
                del self.short[provider]
                self.scheduler.short_providers.discard(provider)
                host = self.add_pool_host(provider)
                # and says so on the bus: the evidence a move of a running job to the pool waits for
                self.put(
                    launch_successful(
                        self.pools[provider].group,
                        host.availability_zone,
                        host.instance_id,
                        self.clock.now(),
                        self.stack.region,
                        self.stack.account,
                    )
                )
                self.on_change(f"  {provider}: capacity is back, instance {host.instance_id} joined")

    def _advance_boots(self) -> None:
        """The boot model's due work: instances that join (ECS and Auto Scaling say so on the bus), those
        their group let go, the PROVISIONING tasks an instance now takes, and those stopped waiting."""
        assert self.boot is not None
        joined, gone = self.boot.advance()
        for host, boot in joined:
            self.put(container_instance_event(self.cluster.describe_host(host)))
            now = self.clock.now()
            self.put(
                launch_successful(
                    boot.pool.group,
                    host.availability_zone,
                    host.instance_id,
                    now,
                    self.stack.region,
                    self.stack.account,
                )
            )
            booted = (now - boot.launched_at).total_seconds()
            self.on_change(
                f"  {host.instance_id} joined {boot.pool.capacity_provider} "
                f"(launched by {boot.why}, {booted:.0f}s ago)"
            )
        for host in gone:
            self._leave(host, "left its Auto Scaling group")
        for arn in self.scheduler.place_waiting():
            where = self.scheduler.placed[arn].rsplit("/", 1)[-1][:8]
            self.on_change(f"  task {arn.rsplit('/', 1)[-1][:8]} placed on {where} (it waited PROVISIONING)")
        # ECS: a task stopped before any instance took it is STOPPED, with no exit code
        for arn, _reason in self.scheduler.take_stopped_waiting():
            task = self.cluster.tasks([arn])[arn]
            self.put(task_event(task, 3, stop_code="UserInitiated", at=self.clock.now()))
            self.on_change(f"  task {arn.rsplit('/', 1)[-1][:8]} stopped while PROVISIONING")

    def _wanted(self, task: dict[str, Any]) -> None:
        """A RunTask left its task PROVISIONING (in the function's thread): ECS says so on the bus, and
        managed scaling will look at the provider."""
        assert self.boot is not None
        self.boot.wanted(task)
        self.put(task_event(task, 1, at=self.clock.now()))
        self.on_change(
            f"  task {task['taskArn'].rsplit('/', 1)[-1][:8]} PROVISIONING: no instance of "
            f"{task.get('capacityProviderName')} fits it"
        )
