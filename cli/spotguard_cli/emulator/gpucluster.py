"""A simulated ECS GPU spot cluster in moto: EC2 instances registered as container instances, GPU task
definitions, and tasks placed on a chosen instance. moto does not model GPUs; the task definitions ask for
them exactly as a real one would, which is what SpotGuard reads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from spotguard.domain.tasks import MANAGED_TAG

# The stand-in for the ECS-optimized GPU AMI: moto takes any id, and listing its AMIs costs seconds.
ECS_GPU_AMI = "ami-0a1b2c3d4e5f60718"


def gpu_container(gpus: int = 1, **more: Any) -> dict[str, Any]:
    """The cluster's GPU container definition: "train" from the examples' image, asking for `gpus` GPUs,
    with `more` of a container definition's fields after (a command, mount points, a log configuration)."""
    return {
        "name": "train",
        "image": "spotguard/examples-train:latest",
        "cpu": 1024,
        "memory": 2048,
        "essential": True,
        "stopTimeout": 120,
        "resourceRequirements": [{"type": "GPU", "value": str(gpus)}],
        **more,
    }


@dataclass(frozen=True)
class Host:
    instance_id: str
    container_instance_arn: str
    availability_zone: str
    instance_type: str
    capacity_provider: str | None = None  # the pool's provider it belongs to (None: registered by hand)


@dataclass(frozen=True)
class PoolGroup:
    """A capacity provider of the cluster: its Auto Scaling group (one type, in `zones`), spot or not."""

    capacity_provider: str
    group: str
    instance_type: str
    zones: tuple[str, ...]
    spot: bool


class GpuCluster:
    def __init__(self, ecs: Any, ec2: Any, name: str = "gpu-spot") -> None:
        self.ecs, self.ec2, self.name = ecs, ec2, name
        self.arn = ecs.create_cluster(clusterName=name)["cluster"]["clusterArn"]
        self.image_id = ECS_GPU_AMI
        self.hosts: list[Host] = []  # in the order they joined

    def add_pools(self, autoscaling: Any, pools: list[PoolGroup]) -> None:
        """The cluster's capacity providers, as examples/gpu-cluster makes them: an Auto Scaling group per
        pool (spot or on-demand, over its zones' subnets, from one launch template), each a capacity
        provider of the cluster. SpotGuard discovers them as it would in AWS."""
        vpc = self.ec2.create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
        zones = sorted({z for p in pools for z in p.zones})
        subnet = {
            z: self.ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.8.{i}.0/24", AvailabilityZone=z)["Subnet"][
                "SubnetId"
            ]
            for i, z in enumerate(zones)
        }
        template = self.ec2.create_launch_template(
            LaunchTemplateName=f"{self.name}-gpu", LaunchTemplateData={"ImageId": self.image_id}
        )["LaunchTemplate"]["LaunchTemplateId"]
        for p in pools:
            autoscaling.create_auto_scaling_group(
                AutoScalingGroupName=p.group,
                MinSize=0,
                MaxSize=10,
                VPCZoneIdentifier=",".join(subnet[z] for z in p.zones),
                MixedInstancesPolicy={
                    "InstancesDistribution": {
                        "OnDemandBaseCapacity": 0,
                        "OnDemandPercentageAboveBaseCapacity": 0 if p.spot else 100,
                        "SpotAllocationStrategy": "price-capacity-optimized",
                    },
                    "LaunchTemplate": {
                        "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "$Latest"},
                        "Overrides": [{"InstanceType": p.instance_type}],
                    },
                },
            )
            arn = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[p.group])[
                "AutoScalingGroups"
            ][0]["AutoScalingGroupARN"]
            self.ecs.create_capacity_provider(
                name=p.capacity_provider, autoScalingGroupProvider={"autoScalingGroupArn": arn}
            )
        self.ecs.put_cluster_capacity_providers(
            cluster=self.name,
            capacityProviders=[p.capacity_provider for p in pools],
            defaultCapacityProviderStrategy=[],
        )

    def add_host(
        self,
        instance_type: str = "g5.xlarge",
        availability_zone: str = "us-east-1a",
        capacity_provider: str | None = None,
        spot: bool = True,
    ) -> Host:
        market = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
        inst = self.ec2.run_instances(
            ImageId=self.image_id,
            MinCount=1,
            MaxCount=1,
            InstanceType=instance_type,
            Placement={"AvailabilityZone": availability_zone},
            **market,
        )["Instances"][0]
        return self.register_host(inst["InstanceId"], instance_type, availability_zone, capacity_provider)

    def register_host(
        self,
        instance_id: str,
        instance_type: str,
        availability_zone: str,
        capacity_provider: str | None = None,
    ) -> Host:
        """The ECS agent of a running EC2 instance registers it as a container instance of the cluster."""
        doc = json.dumps(
            {
                "instanceId": instance_id,
                "instanceType": instance_type,
                "availabilityZone": availability_zone,
            }
        )
        ci = self.ecs.register_container_instance(cluster=self.name, instanceIdentityDocument=doc)
        host = Host(
            instance_id=instance_id,
            container_instance_arn=ci["containerInstance"]["containerInstanceArn"],
            availability_zone=availability_zone,
            instance_type=instance_type,
            capacity_provider=capacity_provider,
        )
        self.hosts.append(host)
        return host

    def remove_host(self, host: Host) -> None:
        """The instance is gone (spot took it back): EC2 terminates it and ECS deregisters it."""
        if host in self.hosts:
            self.hosts.remove(host)
        self.ecs.deregister_container_instance(
            cluster=self.name, containerInstance=host.container_instance_arn, force=True
        )
        self.ec2.terminate_instances(InstanceIds=[host.instance_id])

    def gpu_task_definition(
        self,
        family: str = "train",
        gpus: int = 1,
        command: list[str] | None = None,
        network_mode: str | None = None,
    ) -> str:
        container = gpu_container(gpus)
        if command:
            container["command"] = command
        mode = {"networkMode": network_mode} if network_mode else {}
        resp = self.ecs.register_task_definition(
            family=f"{family}-{gpus}gpu", containerDefinitions=[container], **mode
        )
        return str(resp["taskDefinition"]["taskDefinitionArn"])

    def cpu_task_definition(self, family: str = "sidecar") -> str:
        container = {"name": "app", "image": "busybox", "cpu": 256, "memory": 256, "essential": True}
        resp = self.ecs.register_task_definition(family=family, containerDefinitions=[container])
        return str(resp["taskDefinition"]["taskDefinitionArn"])

    def start(
        self, host: Host, task_definition: str, count: int = 1, managed: bool = True, started_by: str = ""
    ) -> list[str]:
        tags = [{"key": MANAGED_TAG, "value": "true"}] if managed else []
        arns: list[str] = []
        for _ in range(count):
            resp = self.ecs.start_task(
                cluster=self.name,
                taskDefinition=task_definition,
                containerInstances=[host.container_instance_arn],
                tags=tags,
                startedBy=started_by,
            )
            arns += [t["taskArn"] for t in resp["tasks"]]
        return arns

    def describe_host(self, host: Host) -> dict[str, Any]:
        resp = self.ecs.describe_container_instances(
            cluster=self.name, containerInstances=[host.container_instance_arn]
        )
        return dict(resp["containerInstances"][0])

    def tasks(self, arns: list[str]) -> dict[str, dict[str, Any]]:
        resp = self.ecs.describe_tasks(cluster=self.name, tasks=arns)
        return {t["taskArn"]: t for t in resp["tasks"]}
