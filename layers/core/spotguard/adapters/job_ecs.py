"""ECS for the jobs path: RunTask, task descriptions as the domain's TaskEvent, task definitions; and
the interruption path's calls (StopTask among them) by inheritance, so there is one StopTask."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError, ParamValidationError
from botocore.validate import ParamValidator

from spotguard.adapters.ecs import EcsAdapter, chunks
from spotguard.domain.jobs.replies import RunResult, TaskDefinitionInfo
from spotguard.domain.jobs.run_errors import classify_run_error
from spotguard.domain.jobs.task_events import described_task
from spotguard.domain.prices import gpus_of
from spotguard.domain.tasks import TaskEvent, gpu_count


class JobEcsAdapter(EcsAdapter):
    def check_run_task(self, params: dict[str, Any]) -> str | None:
        """What is wrong with these RunTask parameters by ECS's own API model (botocore's validator,
        the one every call goes through), in one line; None when nothing is. No call is made."""
        shape = self.client.meta.service_model.operation_model("RunTask").input_shape
        report = ParamValidator().validate(params, shape)
        if not report.has_errors():
            return None
        line = report.generate_report().splitlines()[0].strip()
        return line if len(line) <= 300 else line[:297] + "..."

    def run_task(self, params: dict[str, Any]) -> RunResult:
        try:
            resp = self.client.run_task(**params)
        except ParamValidationError as exc:  # checked at submit; an adopted request may still hold one
            return RunResult(failure="request", reason=str(exc).splitlines()[-1][:500])
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code, message = str(err.get("Code", "")), str(err.get("Message", ""))
            started = exc.response.get("resourceIds") or err.get("resourceIds") or []
            if code == "ConflictException" and started:
                # The client token already started a task (a repeated launch whose parameters moved on,
                # e.g. a newer checkpoint): that task is the attempt, never a second one beside it.
                return RunResult(task_arn=str(started[0]))
            failure = classify_run_error(code, message)
            if failure is None:
                raise  # not an error ECS documents for RunTask: the record is retried, then dead-lettered
            return RunResult(failure=failure, reason=f"{code}: {message}"[:500])
        tasks = resp.get("tasks") or []
        if tasks:
            return RunResult(task_arn=tasks[0]["taskArn"])
        reasons = [
            f"{f.get('reason', 'unknown')}" + (f" ({f['detail']})" if f.get("detail") else "")
            for f in resp.get("failures") or []
        ]
        return RunResult(failure="capacity", reason="; ".join(reasons)[:500] or "no task was placed")

    def describe_task(self, cluster: str, task_arn: str) -> TaskEvent | None:
        """One task with its tags (adoption reads it once)."""
        resp = self.client.describe_tasks(cluster=cluster, tasks=[task_arn], include=["TAGS"])
        tasks = resp.get("tasks") or []
        return described_task(tasks[0]) if tasks else None

    def describe_many(self, cluster: str, task_arns: Sequence[str]) -> tuple[dict[str, TaskEvent], list[str]]:
        """The tasks ECS still knows (100 per call), and the ones it has forgotten (MISSING)."""
        found: dict[str, TaskEvent] = {}
        missing: list[str] = []
        for chunk in chunks(task_arns):
            resp = self.client.describe_tasks(cluster=cluster, tasks=chunk)
            found.update({t["taskArn"]: described_task(t) for t in resp.get("tasks", [])})
            failed = {f["arn"]: f.get("reason") for f in resp.get("failures", []) if "arn" in f}
            # ECS answers every ARN with a task or a failure; an ARN with neither is gone too.
            missing += [a for a in chunk if a not in found and failed.get(a, "MISSING") == "MISSING"]
        return found, missing

    def largest_gpus(self, cluster: str) -> int | None:
        """The most GPUs any container instance of the cluster (ACTIVE) has: its registered GPU resource,
        or its instance type's (the `ecs.instance-type` attribute ECS gives it). None: no instance."""
        arns: list[str] = []
        for page in self.client.get_paginator("list_container_instances").paginate(
            cluster=cluster, status="ACTIVE"
        ):
            arns += page.get("containerInstanceArns") or []
        most: int | None = None
        for chunk in chunks(arns):
            resp = self.client.describe_container_instances(cluster=cluster, containerInstances=chunk)
            for ci in resp.get("containerInstances") or []:
                registered = [
                    len(r.get("stringSetValue") or [])
                    for r in ci.get("registeredResources") or []
                    if r.get("name") == "GPU"
                ]
                attributes = {a.get("name"): a.get("value") for a in ci.get("attributes") or []}
                kind = attributes.get("ecs.instance-type")
                by_type = (gpus_of(str(kind)) or 0) if kind else 0
                gpus = max([*registered, by_type])
                most = gpus if most is None else max(most, gpus)
        return most

    def task_definition(self, arn: str, overrides: dict[str, Any] | None = None) -> TaskDefinitionInfo:
        td = self.client.describe_task_definition(taskDefinition=arn)["taskDefinition"]
        containers = td.get("containerDefinitions", []) or []
        return TaskDefinitionInfo(
            arn=td.get("taskDefinitionArn", arn),
            family=str(td.get("family", "")),
            task_role_arn=td.get("taskRoleArn"),
            execution_role_arn=td.get("executionRoleArn"),
            network_mode=td.get("networkMode"),
            containers=[str(c.get("name")) for c in containers],
            gpus=gpu_count(td, overrides),
            volumes_at_launch=[
                str(v["name"]) for v in td.get("volumes") or [] if v.get("configuredAtLaunch")
            ],
            mounts={
                str(c.get("name")): {
                    str(m.get("sourceVolume")): str(m.get("containerPath"))
                    for m in c.get("mountPoints") or []
                }
                for c in containers
            },
            environment={
                str(c.get("name")): {
                    str(e.get("name")): str(e.get("value", "")) for e in c.get("environment") or []
                }
                for c in containers
            },
        )
