"""A simulated ECS GPU spot cluster in moto: EC2 instances registered as container instances, GPU task
definitions, and tasks placed on a chosen instance. moto does not model GPUs; the task definitions ask for
them exactly as a real one would, which is what SpotGuard reads."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
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


@dataclass
class Waiting:
    """A task PROVISIONING: its RunTask request and the GPUs it needs, until an instance takes it."""

    request: dict[str, Any]
    need: int


class TaskStates:
    """The tasks ECS keeps PROVISIONING, in moto (motopatch.py): through moto server's local operations
    at `endpoint`, or in this process's moto (endpoint None, under `mock_aws`)."""

    def __init__(self, endpoint: str | None, region: str) -> None:
        self.endpoint, self.region = endpoint, region

    def provision(self, request: dict[str, Any]) -> str:
        from spotguard_cli.emulator import motopatch

        if self.endpoint is None:
            return motopatch.provision_task(self._backend(), request)
        return str(
            motopatch.call_local_ecs(self.endpoint, self.region, "SpotguardProvisionTask", request)["taskArn"]
        )

    def place(self, cluster: str, task_arn: str, container_instance_arn: str) -> None:
        from spotguard_cli.emulator import motopatch

        if self.endpoint is None:
            motopatch.place_task(self._backend(), cluster, task_arn, container_instance_arn)
            return
        body = {"cluster": cluster, "task": task_arn, "containerInstance": container_instance_arn}
        motopatch.call_local_ecs(self.endpoint, self.region, "SpotguardPlaceTask", body)

    def _backend(self) -> Any:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ecs.models import ecs_backends

        return ecs_backends[DEFAULT_ACCOUNT_ID][self.region]


class GpuScheduler:
    """Stands in for ECS task placement, which moto does not model: it answers RunTask (through a
    botocore `before-call` hook, after botocore validated the request) by placing the task on a host
    with free GPUs that meets the request's memberOf constraints (and, for a request with a capacity
    provider strategy, belongs to one of its providers), and it honours client tokens. When nothing fits
    it answers as ECS does without managed scaling: no task, and a failure with reason RESOURCE:GPU.

    With `manage_scaling` (the local stack's boot model, boot.py), a request with a capacity provider
    strategy that nothing fits is answered as ECS with managed scaling answers it: its task, PROVISIONING
    with no container instance (`waiting`), and `wanted` is told so that the provider's group scales
    out; `place_waiting` places such tasks, oldest first, when an instance that fits has joined. A
    waiting task that is stopped goes to `stopped_waiting` (its STOPPED event is the caller's to send).

    `requests` keeps every RunTask request as botocore validated it, for tests to assert on; `refuse`
    makes the next N calls find no capacity; `lose_answers` makes the next N calls start their task
    and then time out, as a call whose answer is lost on the way back."""

    def __init__(self, cluster: GpuCluster) -> None:
        self.cluster = cluster
        self.requests: list[dict[str, Any]] = []
        self.by_token: dict[str, str] = {}
        self.refuse = 0
        self.lose_answers = 0
        self.placed: dict[str, str] = {}  # task arn -> container instance arn
        self.gpus: dict[str, int] = {}  # task arn -> GPUs it holds, while it runs
        self.status: dict[str, str] = {}  # container instance arn -> status SpotGuard set (DRAINING)
        # providers whose Auto Scaling group cannot launch now: their hosts are gone or drained, and a
        # request for only them finds no instance (the local stack's capacity shortage)
        self.short_providers: set[str] = set()
        self._definitions: dict[str, dict[str, Any]] = {}
        self.volumes: list[str] = []  # EBS volumes created for tasks, in order
        self._lock = threading.RLock()
        # managed scaling (manage_scaling): tasks PROVISIONING, in the order they were run
        self.waiting: dict[str, Waiting] = {}
        self.stopped_waiting: list[tuple[str, str]] = []  # (task arn, reason) stopped while waiting
        self._states: TaskStates | None = None
        self._wanted: Callable[[dict[str, Any]], None] = lambda _: None

    def manage_scaling(self, states: TaskStates, wanted: Callable[[dict[str, Any]], None]) -> None:
        """Keep unplaced tasks with a capacity provider strategy PROVISIONING in `states`, telling
        `wanted` of each (its DescribeTasks entry)."""
        self._states, self._wanted = states, wanted

    def is_waiting(self, task_arn: str) -> bool:
        return task_arn in self.waiting

    def take_stopped_waiting(self) -> list[tuple[str, str]]:
        """The tasks stopped while PROVISIONING since the last call, with the stop's reason."""
        with self._lock:
            stopped, self.stopped_waiting = self.stopped_waiting, []
        return stopped

    def place_waiting(self) -> list[str]:
        """Place every PROVISIONING task an instance now fits, oldest first, as ECS does when an
        instance registers or frees resources. The tasks placed."""
        placed: list[str] = []
        with self._lock:
            for arn, w in list(self.waiting.items()):
                host = self._fit(w.request, w.need)
                if host is None or self._states is None:
                    continue
                self._states.place(self.cluster.name, arn, host.container_instance_arn)
                del self.waiting[arn]
                self.placed[arn] = host.container_instance_arn
                self.gpus[arn] = w.need
                placed.append(arn)
        return placed

    def install(self) -> None:
        from spotguard.adapters import clients

        clients.on_event("before-call.ecs.RunTask", self.before_call)
        # what frees GPUs and closes hosts, when SpotGuard does it (moto then does it too)
        clients.on_event("before-call.ecs.StopTask", self._on_stop)
        clients.on_event("before-call.ecs.UpdateContainerInstancesState", self._on_state)

    def before_call(self, params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
        from botocore.awsrequest import AWSResponse
        from botocore.exceptions import ReadTimeoutError

        request = json.loads(params["body"])
        with self._lock:  # concurrent invocations place tasks one at a time, as ECS does per cluster
            self.requests.append(request)
            answer = self.run_task(request)
        if self.lose_answers > 0:
            self.lose_answers -= 1
            raise ReadTimeoutError(endpoint_url="https://ecs.us-east-1.amazonaws.com/")
        return AWSResponse("local://ecs", 200, {}, None), answer

    def run_task(self, request: dict[str, Any]) -> dict[str, Any]:
        from spotguard.domain.tasks import gpu_count

        ecs = self.cluster.ecs
        token = request.get("clientToken")
        if token and token in self.by_token:
            (task,) = self.cluster.tasks([self.by_token[token]]).values()
            return {"tasks": [task], "failures": []}  # the same request again: the same task
        if self.refuse > 0:
            self.refuse -= 1
            return {"tasks": [], "failures": [{"reason": "RESOURCE:GPU"}]}
        providers_asked = {p["capacityProvider"] for p in request.get("capacityProviderStrategy") or []}
        if providers_asked and providers_asked <= self.short_providers:
            return {"tasks": [], "failures": [{"reason": "RESOURCE:GPU"}]}
        td = self._definition(request["taskDefinition"])
        need = gpu_count(td, request.get("overrides"))
        host = self._fit(request, need)
        if host is None:
            if self._states is not None and providers_asked:
                return self._provision(request, need, token)
            return {"tasks": [], "failures": [{"reason": "RESOURCE:GPU"}]}
        resp = ecs.start_task(
            cluster=self.cluster.name,
            taskDefinition=request["taskDefinition"],
            containerInstances=[host.container_instance_arn],
            overrides=request.get("overrides") or {},
            startedBy=request.get("startedBy", ""),
            tags=request.get("tags") or [],
        )
        task = resp["tasks"][0]
        for v in request.get("volumeConfigurations") or []:  # ECS creates the managed EBS volume
            self._create_volume(v.get("managedEBSVolume") or {}, host)
        self.placed[task["taskArn"]] = host.container_instance_arn
        self.gpus[task["taskArn"]] = need
        if token:
            self.by_token[token] = task["taskArn"]
        return {"tasks": [task], "failures": []}

    def _fit(self, request: dict[str, Any], need: int) -> Host | None:
        """The host the request's task goes to (binpacked on GPUs, as the ECS strategy does), or None."""
        constraints = request.get("placementConstraints") or []
        providers = {p["capacityProvider"] for p in request.get("capacityProviderStrategy") or []}
        fitting = [
            (free, order, host)
            for order, host in enumerate(self.cluster.hosts)
            if self.status.get(host.container_instance_arn, "ACTIVE") == "ACTIVE"
            and (not providers or host.capacity_provider in providers)
            and all(_member_of(c.get("expression", ""), _as_container_instance(host)) for c in constraints)
            and (free := self.free_gpus(host)) >= need
        ]
        if not fitting:
            return None
        return min(fitting, key=lambda f: (f[0], f[1]))[2]

    def _provision(self, request: dict[str, Any], need: int, token: str | None) -> dict[str, Any]:
        """The task waits PROVISIONING for an instance of its provider (managed scaling adds one)."""
        assert self._states is not None
        arn = self._states.provision({**request, "cluster": self.cluster.name})
        self.waiting[arn] = Waiting(request=request, need=need)
        if token:
            self.by_token[token] = arn
        task = self.cluster.tasks([arn])[arn]
        self._wanted(task)
        return {"tasks": [task], "failures": []}

    def _create_volume(self, conf: dict[str, Any], host: Host) -> None:
        tags = [
            {"Key": t["key"], "Value": t.get("value", "")}
            for spec in conf.get("tagSpecifications") or []
            for t in spec.get("tags") or []
        ]
        kwargs: dict[str, Any] = {
            "AvailabilityZone": host.availability_zone,
            "Size": int(conf.get("sizeInGiB", 1)),
            "VolumeType": conf.get("volumeType", "gp3"),
            "TagSpecifications": [{"ResourceType": "volume", "Tags": tags}] if tags else [],
        }
        if conf.get("snapshotId"):
            kwargs["SnapshotId"] = conf["snapshotId"]
        self.volumes.append(self.cluster.ec2.create_volume(**kwargs)["VolumeId"])

    def free_gpus(self, host: Host) -> int:
        from spotguard.domain.prices import gpus_of

        used = sum(
            self.gpus.get(a, 0) for a, where in self.placed.items() if where == host.container_instance_arn
        )
        return (gpus_of(host.instance_type) or 0) - used

    def release(self, task_arn: str) -> None:
        """The task stopped: its GPUs are free again."""
        self.gpus.pop(task_arn, None)

    def _definition(self, arn: str) -> dict[str, Any]:
        if arn not in self._definitions:
            self._definitions[arn] = self.cluster.ecs.describe_task_definition(taskDefinition=arn)[
                "taskDefinition"
            ]
        return self._definitions[arn]

    def _on_stop(self, params: dict[str, Any], **_: Any) -> None:
        body = json.loads(params["body"])
        arn = str(body["task"])
        self.release(arn)
        with self._lock:
            if self.waiting.pop(arn, None) is not None:
                self.stopped_waiting.append((arn, str(body.get("reason") or "")))

    def _on_state(self, params: dict[str, Any], **_: Any) -> None:
        body = json.loads(params["body"])
        for arn in body.get("containerInstances") or []:
            self.status[arn] = body.get("status", "ACTIVE")


def _as_container_instance(host: Host) -> dict[str, Any]:
    return {
        "ec2InstanceId": host.instance_id,
        "attributes": [
            {"name": "ecs.instance-type", "value": host.instance_type},
            {"name": "ecs.availability-zone", "value": host.availability_zone},
        ],
    }


def _member_of(expression: str, ci: dict[str, Any]) -> bool:
    """The part of the cluster query language SpotGuard writes: terms joined by `or` (or by `and`),
    each `ec2InstanceId` or `attribute:NAME` with ==, !=, in [..] or !in [..]."""
    attrs = {a["name"]: a.get("value") for a in ci.get("attributes") or []}

    def term(text: str) -> bool:
        m = re.match(r"^\s*(\S+)\s+(==|!=|in|!in)\s+(.+?)\s*$", text)
        if not m:
            raise ValueError(f"cluster query term not understood: {text!r}")
        subject, op, arg = m.groups()
        value = (
            ci.get("ec2InstanceId")
            if subject == "ec2InstanceId"
            else attrs.get(subject.removeprefix("attribute:"))
        )
        if op in ("in", "!in"):
            values = [v.strip() for v in arg.strip("[]").split(",") if v.strip()]
            return (value in values) == (op == "in")
        return (value == arg) == (op == "==")

    if " or " in expression:
        return any(term(t) for t in expression.split(" or "))
    return all(term(t) for t in expression.split(" and "))
