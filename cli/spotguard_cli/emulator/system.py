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
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotguard.adapters import clients
from spotguard_cli.answers import StatusView, read_answer
from spotguard_cli.emulator.assembly import assemble
from spotguard_cli.emulator.boot import SCALE_OUT_SECONDS, BootModel
from spotguard_cli.emulator.gpucluster import Host, PoolGroup, TaskStates
from spotguard_cli.emulator.inject import (
    container_instance_event,
    launch_successful,
    launch_unsuccessful,
    make_event,
    put_entry,
    task_event,
)
from spotguard_cli.emulator.runner import TaskRunner
from spotguard_cli.emulator.template import load
from spotguard_cli.emulator.timeline import reconcile_line

# Shorter waits than in AWS, so that a local run takes a minute: the first retry for capacity (then
# doubling), and the follow-up checks of a held lifecycle action.
LOCAL_ENV = {"SPOTGUARD_RETRY_BASE_SECONDS": "2", "SPOTGUARD_LIFECYCLE_CHECK_SECONDS": "2"}

# The local cluster's pools, as examples/gpu-cluster makes them: two spot capacity providers in different
# zones and an on-demand one over both.
LOCAL_POOLS = [
    PoolGroup("gpu-spot-a", "gpu-spot-a-group", "g5.xlarge", ("us-east-1a",), spot=True),
    PoolGroup("gpu-spot-b", "gpu-spot-b-group", "g5.xlarge", ("us-east-1b",), spot=True),
    PoolGroup("gpu-od", "gpu-od-group", "g5.xlarge", ("us-east-1a", "us-east-1b"), spot=False),
]


class ScaledClock:
    """Time that runs `scale` times faster than the wall clock from the moment it is made: with scale
    300, a second here is five minutes for SpotGuard, so that a job hours long (and its deadline, and
    the capacity policy's ten-minute ticks) plays out in a minute. Scale 1 is the wall clock.

    `jump_to` moves it forward at once (a replay skips the hours when no job runs); it never goes back.
    `start` sets where it starts (a replay starts at its trace's first hour)."""

    def __init__(self, scale: float = 1.0, start: datetime | None = None) -> None:
        if scale <= 0:
            raise ValueError("the time scale must be positive")
        self.scale = scale
        self.origin = datetime.now(UTC)  # the wall clock's reading ...
        self.at = start or self.origin  # ... when this clock read this
        self._lock = threading.Lock()

    def now(self) -> datetime:
        real = datetime.now(UTC)
        if self.scale == 1.0 and self.at == self.origin:
            return real
        with self._lock:
            return self.at + (real - self.origin) * self.scale

    def jump_to(self, when: datetime) -> None:
        """Read `when` from now on (later than now: time moves on by the difference at once)."""
        with self._lock:
            real = datetime.now(UTC)
            now = self.at + (real - self.origin) * self.scale
            if when < now:
                raise ValueError(f"the clock cannot go back from {now.isoformat()} to {when.isoformat()}")
            self.origin, self.at = real, when

    def seconds(self, scaled: float) -> float:
        """Wall-clock seconds for `scaled` seconds of SpotGuard's time."""
        return scaled / self.scale

    def task_environment(self) -> dict[str, str]:
        """What tells the agent in a task to date its manifests on this clock (AgentEnv.clock). Read it
        when the task starts: a jump changes it."""
        if self.scale == 1.0 and self.at == self.origin:
            return {}
        with self._lock:
            return {
                "SPOTGUARD_CLOCK_ORIGIN": f"{self.origin.timestamp():.6f}",
                "SPOTGUARD_CLOCK_AT": f"{self.at.timestamp():.6f}",
                "SPOTGUARD_CLOCK_SCALE": f"{self.scale:g}",
            }


def schedule_seconds() -> float:
    """The reconcile schedule the template gives (rate(N minutes|seconds|hours))."""
    fn = load()["Resources"]["ReconcileFunction"]["Properties"]["Events"]["Schedule"]["Properties"]
    m = re.match(r"rate\((\d+) (minute|minutes|hour|hours|second|seconds)\)", fn["ScheduleExpression"])
    if not m:
        raise ValueError(f"unsupported schedule {fn['ScheduleExpression']!r}")
    unit = {"second": 1, "minute": 60, "hour": 3600}[m.group(2).rstrip("s")]
    return int(m.group(1)) * unit


class LocalSystem:
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
