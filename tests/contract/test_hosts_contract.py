"""The Hosts port (adapters/hosts.py Ec2Hosts), the same cases against its fake (tests/fakes.py FakeHosts)
and against the adapter on moto's ECS and EC2: what a task's container instance runs on (EC2 instance,
type, zone, spot or on-demand, private address), what it costs per hour (the spot market's price in its
zone, or the on-demand list price SpotGuard knows) and how many GPUs it has (SpotGuard's table, else EC2's
instance types); None for a container instance ECS does not know.

Each side's `world` registers instances as container instances (moto: the emulator's GpuCluster) and
reads the spot market (moto: DescribeSpotPriceHistory; the fake: its `spot_prices`).

What moto cannot do: a Fargate task's container instance (none), and a container instance whose EC2
instance EC2 has forgotten (moto keeps terminated instances, as EC2 does for a while; past that EC2
answers InvalidInstanceID.NotFound, which the adapter raises, rather than its instance-id-only facts);
moto quotes one placeholder spot price for every type and zone, and answers every zone where one is asked."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest

from spotguard.adapters.hosts import Ec2Hosts
from spotguard.domain.jobs.replies import HostInfo
from spotguard.domain.prices import on_demand_price
from spotguard_cli.emulator.gpucluster import GpuCluster
from tests.contract.moto_aws import Clients, one_side
from tests.fakes import FakeHosts

CLUSTER = "gpu-spot"
# What EC2's instance types say of a type outside SpotGuard's table (8 V100s), for the fake.
EC2_TYPES = {"p3dn.24xlarge": 8}


class Host(NamedTuple):
    container_instance_arn: str
    instance_id: str
    private_ip: str


class MotoWorld:
    def __init__(self, ecs: Any, ec2: Any) -> None:
        self.ec2 = ec2
        self.cluster = GpuCluster(ecs, ec2, name=CLUSTER)

    def host(self, instance_type: str, zone: str, spot: bool) -> Host:
        h = self.cluster.add_host(instance_type, zone, spot=spot)
        (reservation,) = self.ec2.describe_instances(InstanceIds=[h.instance_id])["Reservations"]
        return Host(h.container_instance_arn, h.instance_id, reservation["Instances"][0]["PrivateIpAddress"])

    def spot_price(self, instance_type: str, zone: str) -> float:
        quotes = self.ec2.describe_spot_price_history(
            InstanceTypes=[instance_type], AvailabilityZone=zone, ProductDescriptions=["Linux/UNIX"]
        )["SpotPriceHistory"]
        return float(quotes[0]["SpotPrice"])


class FakeWorld:
    def __init__(self, fake: FakeHosts) -> None:
        self.fake = fake

    def host(self, instance_type: str, zone: str, spot: bool) -> Host:
        arn, instance_id = self.fake.add(CLUSTER, instance_type, zone, spot=spot)
        return Host(arn, instance_id, self.fake.instances[instance_id]["private_ip"])

    def spot_price(self, instance_type: str, zone: str) -> float:
        return self.fake.spot_prices[(instance_type, zone)]


@dataclass
class Side:
    name: str
    hosts: Any  # Ec2Hosts | FakeHosts
    world: Any  # MotoWorld | FakeWorld


def fake_side() -> Side:
    fake = FakeHosts(spot_prices={("g5.xlarge", "us-east-1b"): 0.4123}, instance_gpus=EC2_TYPES)
    return Side("fake", fake, FakeWorld(fake))


def moto_side(aws: Clients) -> Side:
    return Side("moto", Ec2Hosts(aws["ecs"], aws["ec2"]), MotoWorld(aws["ecs"], aws["ec2"]))


@pytest.fixture(params=["fake", "moto"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    yield from one_side(request, ("ecs", "ec2"), fake_side, moto_side)


def test_a_spot_host_costs_its_zones_spot_price(side: Side):
    host = side.world.host("g5.xlarge", "us-east-1b", spot=True)
    assert side.hosts.facts(CLUSTER, host.container_instance_arn) == HostInfo(
        instance_id=host.instance_id,
        instance_type="g5.xlarge",
        availability_zone="us-east-1b",
        lifecycle="spot",
        instance_price=side.world.spot_price("g5.xlarge", "us-east-1b"),
        instance_gpus=1,
        private_ip=host.private_ip,
    )


def test_an_on_demand_host_costs_its_list_price(side: Side):
    host = side.world.host("g5.12xlarge", "us-east-1a", spot=False)
    facts = side.hosts.facts(CLUSTER, host.container_instance_arn)
    assert facts == HostInfo(
        instance_id=host.instance_id,
        instance_type="g5.12xlarge",
        availability_zone="us-east-1a",
        lifecycle="on-demand",
        instance_price=on_demand_price("g5.12xlarge"),
        instance_gpus=4,
        private_ip=host.private_ip,
    )
    assert facts.instance_price == 5.672


def test_a_type_spotguard_does_not_list_has_its_gpus_from_ec2_and_no_price(side: Side):
    gpu = side.world.host("p3dn.24xlarge", "us-east-1a", spot=False)
    cpu = side.world.host("m5.large", "us-east-1a", spot=False)
    gpu_facts, cpu_facts = (side.hosts.facts(CLUSTER, h.container_instance_arn) for h in (gpu, cpu))
    assert (gpu_facts.instance_gpus, gpu_facts.instance_price, gpu_facts.lifecycle) == (8, None, "on-demand")
    assert (cpu_facts.instance_gpus, cpu_facts.instance_type) == (None, "m5.large")


def test_a_container_instance_ecs_does_not_know_has_no_facts(side: Side):
    host = side.world.host("g5.xlarge", "us-east-1b", spot=True)
    unknown = host.container_instance_arn.rsplit("/", 1)[0] + "/" + "0" * 32
    assert side.hosts.facts(CLUSTER, unknown) is None
    assert side.hosts.facts(CLUSTER, host.container_instance_arn).instance_id == host.instance_id
