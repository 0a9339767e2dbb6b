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


@dataclass(frozen=True)
class Host:
    instance_id: str
    container_instance_arn: str
    availability_zone: str
    instance_type: str


class GpuCluster:
    def __init__(self, ecs: Any, ec2: Any, name: str = "gpu-spot") -> None:
        self.ecs, self.ec2, self.name = ecs, ec2, name
        self.arn = ecs.create_cluster(clusterName=name)["cluster"]["clusterArn"]
        self.image_id = ECS_GPU_AMI

    def add_host(self, instance_type: str = "g5.xlarge", availability_zone: str = "us-east-1a") -> Host:
        inst = self.ec2.run_instances(
            ImageId=self.image_id,
            MinCount=1,
            MaxCount=1,
            InstanceType=instance_type,
            Placement={"AvailabilityZone": availability_zone},
            InstanceMarketOptions={"MarketType": "spot"},
        )["Instances"][0]
        doc = json.dumps(
            {
                "instanceId": inst["InstanceId"],
                "instanceType": instance_type,
                "availabilityZone": availability_zone,
            }
        )
        ci = self.ecs.register_container_instance(cluster=self.name, instanceIdentityDocument=doc)
        return Host(
            instance_id=inst["InstanceId"],
            container_instance_arn=ci["containerInstance"]["containerInstanceArn"],
            availability_zone=availability_zone,
            instance_type=instance_type,
        )

    def gpu_task_definition(
        self, family: str = "train", gpus: int = 1, command: list[str] | None = None
    ) -> str:
        container: dict[str, Any] = {
            "name": "train",
            "image": "spotguard/examples-train:latest",
            "cpu": 1024,
            "memory": 2048,
            "essential": True,
            "stopTimeout": 120,
            "resourceRequirements": [{"type": "GPU", "value": str(gpus)}],
        }
        if command:
            container["command"] = command
        resp = self.ecs.register_task_definition(
            family=f"{family}-{gpus}gpu", containerDefinitions=[container]
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
