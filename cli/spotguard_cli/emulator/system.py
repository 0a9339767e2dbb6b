"""`LocalSystem`: the whole of SpotGuard running on one machine, against moto server on 127.0.0.1.

- the template deployed into moto's CloudFormation (stack.py), so queues, tables, bucket, rules and
  functions with their resolved environment are what the template says;
- every function's handler in this process with its own environment; a poller per queue plays Lambda's
  event source mapping (batch size, partial batch responses, visibility timeout, redrive), and the
  template's schedule drives the reconcile function;
- a GPU spot cluster of simulated instances, ECS placement played by `GpuScheduler` (moto models no
  GPUs), and the tasks run as local processes by `TaskRunner`, whose state changes go on the bus;
- events (notices, task changes) are put on moto's EventBridge bus, so the template's own rules route them;
- with `boot_seconds`, the boot model (boot.py): the pools' instances come from their Auto Scaling
  groups and join after a boot, and a RunTask that no instance fits waits PROVISIONING while managed
  scaling adds one. Without it (the default), instances join when they are added, and such a RunTask
  fails with RESOURCE:GPU.

The parts are put together by `assembly.assemble`. `pump()` does one round of everything; the demo,
`spotguard local up` and the e2e tests drive it.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from spotguard.adapters import clients
from spotguard_cli.answers import StatusView, read_answer
from spotguard_cli.emulator.assembly import assemble
from spotguard_cli.emulator.boot import SCALE_OUT_SECONDS, BootModel
from spotguard_cli.emulator.inject import make_event, put_entry
from spotguard_cli.emulator.pools import SystemPools
from spotguard_cli.emulator.runner import TaskRunner
from spotguard_cli.emulator.scaledclock import ScaledClock, schedule_seconds
from spotguard_cli.emulator.timeline import reconcile_line

# Shorter waits than in AWS, so that a local run takes a minute: the first retry for capacity (then
# doubling), and the follow-up checks of a held lifecycle action.
LOCAL_ENV = {"SPOTGUARD_RETRY_BASE_SECONDS": "2", "SPOTGUARD_LIFECYCLE_CHECK_SECONDS": "2"}


class LocalSystem(SystemPools):
    """The stack deployed into moto server and running: functions, pollers, schedule, tasks as processes."""

    def __init__(
        self,
        endpoint: str,
        log_dir: Path,
        parameters: dict[str, str] | None = None,
        on_change: Callable[[str], None] = lambda _: None,
        reconcile_every: float | None = None,
        time_scale: float = 1.0,
        clock_start: datetime | None = None,
        schedule_aside: bool = False,
        boot_seconds: float | None = None,
        scale_out_seconds: float = SCALE_OUT_SECONDS,
    ) -> None:
        """`boot_seconds` (None: no boot model) and `scale_out_seconds` are the boot model's, in the
        stack's time (boot.py); it starts with `add_pools`."""
        if boot_seconds is not None and (boot_seconds < 0 or scale_out_seconds < 0):
            raise ValueError("the boot and the scale-out take no less than 0 seconds")
        self.boot_seconds, self.scale_out_seconds = boot_seconds, scale_out_seconds
        self.boot: BootModel | None = None
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.on_change = on_change
        self.function_log = (log_dir / "functions.log").open("a")
        try:
            parts = assemble(endpoint, parameters, LOCAL_ENV, log=self.function_log)
        except BaseException:
            self.function_log.close()
            raise
        self.stack, self.cluster, self.scheduler = parts.stack, parts.cluster, parts.scheduler
        self.functions, self.pollers = parts.functions, parts.pollers
        self.guard = parts.guard  # every call a function made that its role does not allow
        self.events = self.stack.client("events")
        self.clock = ScaledClock(time_scale, clock_start)
        self.reconcile_every = reconcile_every or self.clock.seconds(schedule_seconds())
        self._next_reconcile = time.monotonic() + self.reconcile_every
        # With `schedule_aside`, the scheduled reconcile runs in a thread of its own, as Lambda runs it
        # beside the event-driven functions, instead of holding up every queue for its sweep (a replay's
        # fast clock makes a sweep's tenth of a second minutes of SpotGuard's time).
        self.schedule_aside = schedule_aside
        self._sweep: threading.Thread | None = None
        self.runner = TaskRunner(
            self.cluster,
            self.events,
            endpoint,
            self.stack.region,
            log_dir,
            on_change,
            cwd=Path.cwd(),
            on_exit=self.scheduler.release,
            environment=self.clock.task_environment,
            clock=self.clock.now,
            waiting=self.scheduler.is_waiting,
        )
        if (
            time_scale != 1.0 or clock_start is not None
        ):  # every function reads the scaled time, and SQS delays shrink with it
            for host in self.functions.values():
                runtime = getattr(host.module, "runtime", None)
                if runtime is not None and hasattr(runtime, "clock"):
                    runtime.clock = self.clock.now
            for op in ("SendMessage", "SendMessageBatch"):
                clients.on_event(f"before-parameter-build.sqs.{op}", self._scale_delay)
        self.short: dict[str, float] = {}  # capacity provider -> wall-clock end of its shortage
        clients.on_event("before-call.ssm.SendCommand", self._ssm)
        clients.on_event("after-call.ecs.DescribeTasks", self._describe_tasks)
        # moto cannot complete or heartbeat a lifecycle action: record them, and answer as Auto Scaling.
        self.lifecycle_calls: list[tuple[str, str, str]] = []
        for op in ("CompleteLifecycleAction", "RecordLifecycleActionHeartbeat"):
            clients.on_event(f"before-call.autoscaling.{op}", self._lifecycle)

    # ---------------------------------------------------------------------------------------- world
    def put(self, event: dict[str, Any]) -> None:
        resp = self.events.put_events(Entries=[put_entry(event)])
        if resp.get("FailedEntryCount"):
            raise RuntimeError(f"EventBridge refused the event: {resp['Entries']}")

    def notice(self, kind: str, instance_id: str, **detail: Any) -> dict[str, Any]:
        event = make_event(
            kind,
            instance_id,
            at=self.clock.now(),
            region=self.stack.region,
            account=self.stack.account,
            **detail,
        )
        self.put(event)
        return event

    def invoke_jobs(self, payload: dict[str, Any]) -> dict[str, Any]:
        return dict(self.functions["JobsFunction"].invoke(payload))

    # -------------------------------------------------------------------------------------- running
    def pump(self) -> int:
        """One round: the boot model's due work, the tasks' processes, every queue until empty, the
        schedule. Records handled."""
        if self.boot is not None:
            self._advance_boots()
        self._end_shortages()
        self.runner.poll()
        handled = 0
        for poller in self.pollers:
            n, _ = poller.drain()
            handled += n
        if time.monotonic() >= self._next_reconcile:
            self._next_reconcile = time.monotonic() + self.reconcile_every
            if not self.schedule_aside:
                self._reconcile()
            elif self._sweep is None or not self._sweep.is_alive():  # one sweep at a time
                self._sweep = threading.Thread(target=self._reconcile, name="reconcile", daemon=True)
                self._sweep.start()
        return handled

    def _reconcile(self) -> None:
        counts = self.functions["ReconcileFunction"].invoke({"id": "local-schedule"})
        line = reconcile_line(counts)  # only a run that did something: one that only looked says nothing
        if line is not None:
            self.on_change(line)

    def run_until(self, done: Callable[[], bool], timeout: float, every: float = 0.1) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            if done():
                return True
            time.sleep(every)
        return False

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.join(timeout=60)
        self.runner.stop_all()
        self.function_log.close()

    def dead_letters(self) -> dict[str, int]:
        sqs = self.stack.client("sqs")
        out = {}
        for key, url in self.stack.outputs.items():
            if key.endswith("DeadLetterQueueUrl"):
                attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
                out[key.removesuffix("Url")] = int(attrs["Attributes"]["ApproximateNumberOfMessages"])
        return out

    def task_definition(
        self,
        command: list[str],
        gpus: int = 1,
        environment: dict[str, str] | None = None,
        family: str = "job",
        network_mode: str | None = None,
    ) -> str:
        """A GPU task definition whose container runs `command` here, as a local process."""
        mode = {"networkMode": network_mode} if network_mode else {}
        resp = self.cluster.ecs.register_task_definition(
            **mode,
            family=f"{family}-{gpus}gpu",
            containerDefinitions=[
                {
                    "name": "main",
                    "image": "spotguard/examples-train:latest",
                    "command": command,
                    "cpu": 1024,
                    "memory": 2048,
                    "essential": True,
                    "stopTimeout": 60,
                    "resourceRequirements": [{"type": "GPU", "value": str(gpus)}],
                    "environment": [{"name": k, "value": v} for k, v in (environment or {}).items()],
                }
            ],
        )
        return str(resp["taskDefinition"]["taskDefinitionArn"])

    def job_status(self, job_id: str) -> StatusView:
        """The job's status, read as the CLI reads it (AnswerError, in one line, when there is none)."""
        return read_answer(self.invoke_jobs({"action": "status", "job_id": job_id})).status()

    def job_state(self, job_id: str) -> str:
        answer = read_answer(self.invoke_jobs({"action": "status", "job_id": job_id}))
        return answer.job.state if answer.ok and answer.job is not None else "unknown"

    def _lifecycle(self, model: Any, params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
        from urllib.parse import parse_qs

        from botocore.awsrequest import AWSResponse

        body = params.get("body") or ""
        if isinstance(body, dict):  # the query protocol's serializer hands over the fields themselves
            fields = {k: str(v) for k, v in body.items()}
        else:
            fields = {k: v[0] for k, v in parse_qs(body if isinstance(body, str) else body.decode()).items()}
        instance = fields.get("InstanceId", "")
        self.lifecycle_calls.append((model.name, instance, fields.get("LifecycleActionResult", "")))
        self.on_change(f"  {model.name} for {instance}")
        return AWSResponse("local://autoscaling", 200, {}, None), {}

    def _describe_tasks(self, parsed: dict[str, Any], **_: Any) -> None:
        self.runner.describe(parsed)

    def _scale_delay(self, params: dict[str, Any], **_: Any) -> None:
        """SpotGuard's delayed messages (retries, launch rechecks, lifecycle checks) wait scaled time."""
        for entry in [params, *(params.get("Entries") or [])]:
            if entry.get("DelaySeconds"):
                entry["DelaySeconds"] = max(0, math.ceil(self.clock.seconds(float(entry["DelaySeconds"]))))

    def _ssm(self, params: dict[str, Any], **_: Any) -> None:
        """The SSM agent on the simulated instance: run SpotGuard's signal document with the command's
        parameters (moto then records the command as usual)."""
        body = json.loads(params.get("body") or b"{}")
        self.runner.signal_by_document(dict(body.get("Parameters") or {}))
        return None
