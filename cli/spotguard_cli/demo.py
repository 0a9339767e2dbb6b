"""`spotguard demo`: the interruption path end to end, on this machine, with no AWS account.

moto server on 127.0.0.1 gets the stack that template.yaml describes (translated by aws-sam-translator)
and a GPU spot cluster of two hosts. A spot interruption warning is put on the default bus; the
template's own rule routes it to the interruptions queue; the interruption function (run in-process with
the environment the stack gave it) drains the host and stops its managed tasks so that they checkpoint.
Then the warning is delivered again and the instance's state change follows, as at-least-once delivery
and a second source would do; and a rebalance recommendation for the other host asks its task for a
checkpoint with SIGUSR1 over SSM. The demo prints a timeline and checks the outcome: exit 0 only if
every check holds.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CheckList = list[tuple[str, bool]]
LOG_DIR = Path(".local-stack")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the interruption path against moto server on 127.0.0.1")
    p.add_argument("--json", action="store_true", help="print the timeline and checks as JSON")
    p.set_defaults(run=run)


class Timeline:
    """What happened, in order; shown as seconds since the warning (negative = set-up before it)."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self._rows: list[tuple[float, str]] = []

    def mark_zero(self) -> None:
        self.t0 = time.monotonic()

    def add(self, what: str) -> None:
        self._rows.append((time.monotonic(), what))

    @property
    def rows(self) -> list[tuple[float, str]]:
        zero = self.t0 if self.t0 is not None else (self._rows[0][0] if self._rows else 0.0)
        return [(t - zero, w) for t, w in self._rows]


def _call_recorder(timeline: Timeline, calls: list[str]) -> Callable[..., None]:
    interesting = {"UpdateContainerInstancesState", "StopTask", "SendCommand", "CompleteLifecycleAction"}

    def hook(model: Any, params: dict[str, Any], **_: Any) -> None:
        calls.append(model.name)
        if model.name == "StopTask":
            timeline.add(
                f"  StopTask {params['task'].rsplit('/', 1)[-1][:8]}…  reason: {params.get('reason')}"
            )
        elif model.name == "UpdateContainerInstancesState":
            timeline.add(
                f"  drain {params['containerInstances'][0].rsplit('/', 1)[-1][:8]}… -> {params['status']}"
            )
        elif model.name == "SendCommand":
            cmds = params.get("Parameters", {}).get("commands", [])
            timeline.add(f"  SSM Run Command on {params['InstanceIds'][0]}: {cmds[0] if cmds else ''}")
        elif model.name in interesting:
            timeline.add(f"  {model.name}")

    return hook


def run(args: argparse.Namespace) -> int:
    # Imported here so that `spotguard explain` stays fast and needs neither moto nor boto3 clients.
    from spotguard.adapters import clients
    from spotguard_cli.gpucluster import GpuCluster
    from spotguard_cli.inject import container_instance_event, make_event, put_entry
    from spotguard_cli.local import FunctionHost, QueuePoller, deploy
    from spotguard_cli.motoserver import MotoServer, hold_ecs_tasks

    timeline, calls = Timeline(), []
    checks: CheckList = []
    say = (lambda *_: None) if args.json else print
    with MotoServer() as moto:
        moto_pid = moto.proc.pid if moto.proc else None
        say(f"moto server on {moto.endpoint} (pid {moto.proc.pid if moto.proc else '?'})")
        hold_ecs_tasks(moto.endpoint)
        stack = deploy(moto.endpoint, {"ClusterNames": "gpu-spot", "RebalanceAction": "checkpoint"})
        say(
            f"stack deployed from template.yaml: {len(stack.outputs)} outputs, functions: "
            f"{', '.join(f.name for f in stack.functions.values())}"
        )
        ecs, ec2, events = stack.client("ecs"), stack.client("ec2"), stack.client("events")
        cluster = GpuCluster(ecs, ec2, "gpu-spot")
        a = cluster.add_host("g5.xlarge", "us-east-1a")
        b = cluster.add_host("g5.xlarge", "us-east-1b")
        gpu1 = cluster.gpu_task_definition("train", gpus=1)
        sidecar = cluster.cpu_task_definition("metrics-sidecar")
        managed_a = cluster.start(a, gpu1, count=2)
        unmanaged_a = cluster.start(a, sidecar, count=1, managed=False)
        managed_b = cluster.start(b, gpu1, count=1)
        say(
            f"cluster gpu-spot: host A {a.instance_id} runs 2 managed GPU tasks + 1 unmanaged sidecar; "
            f"host B {b.instance_id} runs 1 managed GPU task"
        )

        LOG_DIR.mkdir(exist_ok=True)
        log = (LOG_DIR / "demo-functions.log").open("w")
        host = FunctionHost(stack, stack.functions["InterruptionFunction"], log=log)
        clients.on_every_call(_call_recorder(timeline, calls))
        poller = QueuePoller(stack, host)

        def put(event: dict[str, Any], label: str) -> None:
            resp = events.put_events(Entries=[put_entry(event)])
            assert resp["FailedEntryCount"] == 0, resp
            timeline.add(f"{label} put on the default bus")

        # ECS tells SpotGuard where the container instances are (the index), as it would in AWS.
        for h in (a, b):
            put(
                container_instance_event(cluster.describe_host(h)),
                f"container instance change ({h.instance_id})",
            )
        poller.drain()
        calls.clear()

        timeline.mark_zero()
        warning = make_event("spot-interruption", a.instance_id, at=datetime.now(UTC))
        put(warning, f"SPOT INTERRUPTION WARNING for host A {a.instance_id}")
        delivered, failed = poller.drain()
        timeline.add(f"interruptions queue: {delivered} record(s) handled, {failed} failed")
        stops_after_warning = calls.count("StopTask")

        # At-least-once delivery: the same message again, then the second source for the same end.
        sqs = stack.client("sqs")
        sqs.send_message(QueueUrl=poller.queue_url, MessageBody=poller.delivered[-1])
        put(
            make_event("instance-state-change", a.instance_id, state="shutting-down"), "instance state change"
        )
        delivered, failed = poller.drain()
        timeline.add(f"duplicate + state change: {delivered} record(s) handled, {failed} failed")

        put(make_event("rebalance-recommendation", b.instance_id), "rebalance recommendation for host B")
        delivered, failed = poller.drain()
        timeline.add(f"interruptions queue: {delivered} record(s) handled, {failed} failed")

        a_desc, b_desc = cluster.describe_host(a), cluster.describe_host(b)
        tasks = cluster.tasks(managed_a + unmanaged_a + managed_b)
        ssm = stack.client("ssm")
        commands = ssm.list_commands()["Commands"]
        checks += [
            ("host A is DRAINING", a_desc["status"] == "DRAINING"),
            ("host B still takes work (ACTIVE)", b_desc["status"] == "ACTIVE"),
            (
                "both managed tasks on A were stopped",
                all(tasks[t]["desiredStatus"] == "STOPPED" for t in managed_a),
            ),
            ("each stop names the notice", all(warning_id_in(tasks[t], a.instance_id) for t in managed_a)),
            (
                "StopTask called exactly once per managed task",
                calls.count("StopTask") == 2 == stops_after_warning,
            ),
            (
                "the unmanaged sidecar on A was left alone",
                tasks[unmanaged_a[0]]["desiredStatus"] == "RUNNING",
            ),
            ("B's task keeps running after the rebalance", tasks[managed_b[0]]["desiredStatus"] == "RUNNING"),
            (
                "B's task was sent SIGUSR1 over SSM once",
                len(commands) == 1 and "SIGUSR1" in json.dumps(commands, default=str),
            ),
            (
                "nothing went to the dead-letter queue",
                _visible(sqs, stack.outputs["InterruptionsDeadLetterQueueUrl"]) == 0,
            ),
        ]
        notices = host.module.runtime.ledger.notices(a.instance_id)
        checks.append(("the ledger holds both notices for A", len(notices) == 2))

    ok = all(passed for _, passed in checks)
    if args.json:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "moto_pid": moto_pid,
                    "timeline": [{"seconds": round(t, 3), "what": w} for t, w in timeline.rows],
                    "checks": [{"check": c, "passed": p} for c, p in checks],
                }
            )
        )
        return 0 if ok else 1
    print("\ntimeline (seconds since the warning was put on the bus):")
    for t, what in timeline.rows:
        print(f"  {t:+8.3f}s  {what}")
    print("\nchecks:")
    for c, passed in checks:
        print(f"  [{'ok' if passed else 'FAILED'}] {c}")
    first_stop = next((t for t, w in timeline.rows if "StopTask" in w), None)
    if first_stop is not None:
        print(f"\nfrom the warning on the bus to the first StopTask: {first_stop:.3f}s (of 120 s)")
    print(f"function logs and metrics (EMF): {LOG_DIR / 'demo-functions.log'}")
    print("moto server stopped.\n" + ("demo passed" if ok else "demo FAILED"))
    return 0 if ok else 1


def warning_id_in(task: dict[str, Any], instance_id: str) -> bool:
    reason = task.get("stoppedReason", "")
    return reason.startswith("SpotGuard: spot-interruption ") and instance_id in reason


def _visible(sqs: Any, url: str) -> int:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attrs["Attributes"]["ApproximateNumberOfMessages"])
