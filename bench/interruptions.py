"""Benchmark of the interruption path: AWS calls and handler milliseconds per notice.

Runs the interruption function in-process against moto (in-process too), with the stack created from
template.yaml. With the task index, each task's RUNNING event first goes through the task-events
function (as in AWS), which records the host's tasks in the ledger, so a notice needs no DescribeTasks.
Prints, for each scenario: the AWS calls on the path from the notice to the last signal (by API), all
calls the handler made, and the handler's wall time (median of the repeats; this includes moto's own
processing of every call, so it is an upper bound on SpotGuard's part, and only ratios within one run
mean anything on a shared machine).

    .venv/bin/python bench/interruptions.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter
from typing import Any

from moto import mock_aws
from moto.moto_api import state_manager

from spotguard.adapters import clients
from spotguard_cli.emulator.gpucluster import GpuCluster
from spotguard_cli.emulator.inject import container_instance_event, make_event, sqs_envelope, task_event
from spotguard_cli.emulator.lambdas import FunctionHost
from spotguard_cli.emulator.stack import deploy

os.environ.update(
    {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
)
os.environ.pop("AWS_ENDPOINT_URL", None)  # moto in this process, never an endpoint

SIGNALS = {"StopTask", "SendCommand"}
DEVNULL = open(os.devnull, "w")  # noqa: SIM115  (the function's logs; Powertools keeps one handler per process)


class World:
    def __init__(self, clusters: int) -> None:
        # The hosts under test are in the last watched cluster: a lookup without the index searches all.
        names = [f"gpu-extra-{i}" for i in range(clusters - 1)] + ["gpu-spot"]
        self.stack = deploy(None, {"ClusterNames": ",".join(names)})
        ecs, ec2 = self.stack.client("ecs"), self.stack.client("ec2")
        for extra in names[:-1]:  # other watched clusters, each with a host, so lookups have work to do
            GpuCluster(ecs, ec2, extra).add_host()
        self.cluster = GpuCluster(ecs, ec2, "gpu-spot")
        self.td = self.cluster.gpu_task_definition()
        clients.reset()
        self.host = FunctionHost(self.stack, self.stack.functions["InterruptionFunction"], log=DEVNULL)
        self.task_events = FunctionHost(self.stack, self.stack.functions["TaskEventsFunction"], log=DEVNULL)
        self.calls: list[str] = []
        clients.on_every_call(lambda model, **_: self.calls.append(model.name))

    def host_with_tasks(self, n: int, indexed: bool = True, task_index: bool = True) -> str:
        h = self.cluster.add_host()
        arns = self.cluster.start(h, self.td, count=n) if n else []
        if indexed:
            self.invoke([container_instance_event(self.cluster.describe_host(h))])
        if task_index and arns:
            tasks: dict[str, Any] = {}
            for i in range(0, len(arns), 100):  # DescribeTasks takes 100 at a time
                tasks.update(self.cluster.tasks(arns[i : i + 100]))
            events = [json.dumps(task_event(t, 2)) for t in tasks.values()]
            for i in range(0, len(events), 10):
                result = self.task_events.invoke(sqs_envelope(events[i : i + 10]))
                assert not result["batchItemFailures"], result
        return h.instance_id

    def invoke(self, events: list[dict[str, Any]]) -> tuple[float, list[str]]:
        self.calls.clear()
        envelope = sqs_envelope([json.dumps(e) for e in events])
        t = time.perf_counter()
        result = self.host.invoke(envelope)
        elapsed = (time.perf_counter() - t) * 1000
        assert not result["batchItemFailures"], result
        return elapsed, list(self.calls)


def path_calls(calls: list[str]) -> list[str]:
    """The calls up to and including the last signal."""
    last = max((i for i, c in enumerate(calls) if c in SIGNALS), default=-1)
    return calls[: last + 1]


def scenario(
    label: str, clusters: int, tasks: int, notices: int, indexed: bool, repeat: int, task_index: bool = True
) -> dict[str, Any]:
    times, paths, totals = [], [], []
    for _ in range(repeat):
        with mock_aws():
            state_manager.set_transition("ecs::task", {"progression": "manual", "times": 10**9})
            w = World(clusters)
            ids = [w.host_with_tasks(tasks, indexed, task_index) for _ in range(notices)]
            elapsed, calls = w.invoke([make_event("spot-interruption", i) for i in ids])
            assert calls.count("StopTask") == tasks * notices, Counter(calls)
            times.append(elapsed)
            paths.append(path_calls(calls))
            totals.append(calls)
        clients.reset()
    path = paths[-1]
    overhead = [c for c in path if c not in SIGNALS]
    return {
        "scenario": label,
        "notices": notices,
        "tasks_per_notice": tasks,
        "clusters": clusters,
        "indexed": indexed,
        "task_index": task_index,
        "path_calls": len(path),
        "path_calls_besides_signals": len(overhead),
        "path_by_api": dict(Counter(overhead)),
        "all_calls": len(totals[-1]),
        "handler_ms_median": round(statistics.median(times), 1),
        "handler_ms_per_notice": round(statistics.median(times) / notices, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [
        scenario("1 instance, 1 task", 1, 1, 1, True, args.repeat),
        scenario("1 instance, 8 tasks", 1, 8, 1, True, args.repeat),
        scenario("batch of 10 notices, 4 tasks each", 1, 4, 10, True, args.repeat),
        scenario("8 tasks, 10 watched clusters", 10, 8, 1, True, args.repeat),
        scenario("8 tasks, not indexed, 1 cluster", 1, 8, 1, False, args.repeat),
        scenario("8 tasks, not indexed, 10 clusters", 10, 8, 1, False, args.repeat),
        scenario("100 tasks", 1, 100, 1, True, 1),
        scenario("200 tasks", 1, 200, 1, True, 1),
        scenario("300 tasks", 1, 300, 1, True, 1),
        scenario("100 tasks, no task index", 1, 100, 1, True, 1, task_index=False),
        scenario("200 tasks, no task index", 1, 200, 1, True, 1, task_index=False),
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    head = f"{'scenario':38} {'path calls':>10} {'besides signals':>15} {'all calls':>9} {'ms/notice':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['scenario']:38} {r['path_calls']:>10} {r['path_calls_besides_signals']:>15} "
            f"{r['all_calls']:>9} {r['handler_ms_per_notice']:>9}"
        )
    print("\ncalls besides signals, by API:")
    for r in rows:
        print(f"  {r['scenario']:38} {r['path_by_api']}")


if __name__ == "__main__":
    main()
