"""`GpuScheduler`: ECS task placement on the simulated GPU cluster (gpucluster.py), which moto does not
model: RunTask answered by placing the task on a host with free GPUs that meets the request's constraints,
and with managed scaling, the tasks nothing fits kept PROVISIONING (`TaskStates`) until an instance joins."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spotguard_cli.emulator.gpucluster import GpuCluster, Host


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
