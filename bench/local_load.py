"""Load benchmark of the local stack: many instances interrupted at once.

200 simulated g5.12xlarge spot instances (4 GPUs) each run 4 managed 1-GPU jobs (and 200 more instances
are free to take them). Their 200 spot interruption warnings are put on moto server's bus within one
second; the interruption function (one process here, where Lambda would run many at once) drains each
host and stops its tasks; the tasks (simulated containers: they exit 75 a moment after SIGTERM, as the
agent does) stop, and every job is resubmitted. Prints the time from each warning to its last StopTask
(p50, p99, max), the handler's time per notice, the AWS calls per instance on the interruption path,
and checks that every task was stopped once and every job resubmitted once.

    .venv/bin/python bench/local_load.py [--instances 200] [--tasks 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from spotguard.adapters import clients
from spotguard_cli.emulator.inject import make_event, put_entry
from spotguard_cli.emulator.motoserver import MotoServer
from spotguard_cli.emulator.system import LocalSystem


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(instances: int, tasks: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="spotguard-load-"))
    stops: dict[str, list[tuple[float, str]]] = {}  # instance id -> (time, task arn) of each StopTask
    calls: list[str] = []
    with MotoServer(log_path=str(work / "moto.log")) as moto:
        system = LocalSystem(moto.endpoint, work, reconcile_every=3600)
        try:

            def hook(model: Any, params: dict[str, Any], **_: Any) -> None:
                calls.append(model.name)
                if model.name == "StopTask":
                    instance = str(params.get("reason", "")).rsplit(" on ", 1)[-1]
                    stops.setdefault(instance, []).append((time.monotonic(), params["task"]))

            clients.on_every_call(hook)
            doomed = [system.add_host("g5.12xlarge", "us-east-1a") for _ in range(instances)]
            for _ in range(instances):
                system.add_host("g5.12xlarge", "us-east-1b")
            td = system.task_definition(["sim:checkpointing", "0.2"], gpus=1)
            t = time.monotonic()
            jobs = []
            for i in range(instances * tasks):
                answer = system.invoke_jobs(
                    {
                        "action": "submit",
                        "job_id": f"load-{i}",
                        "request": {"cluster": "gpu-spot", "taskDefinition": td},
                    }
                )
                assert answer["ok"], answer
                jobs.append(answer["job"]["job_id"])
            system.pump()  # the tasks start; their RUNNING events fill the host's task index
            system.pump()
            setup = time.monotonic() - t
            placed = Counter(system.scheduler.placed.values())
            assert all(placed[h.container_instance_arn] == tasks for h in doomed), (
                "jobs not on the doomed hosts"
            )

            calls.clear()
            put_at: dict[str, float] = {}
            batches = [
                [
                    (h.instance_id, put_entry(make_event("spot-interruption", h.instance_id)))
                    for h in doomed[i : i + 10]
                ]
                for i in range(0, instances, 10)  # PutEvents takes 10 entries at a time
            ]

            def put(batch: list[tuple[str, dict[str, Any]]]) -> None:
                system.events.put_events(Entries=[entry for _, entry in batch])
                now = time.monotonic()
                put_at.update({instance: now for instance, _ in batch})

            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=len(batches)) as pool:  # as 200 instances' warnings come
                list(pool.map(put, batches))
            put_span = time.monotonic() - t0
            interruptions = system.pollers[0]
            assert "Interruptions" in interruptions.queue_arn
            t1 = time.monotonic()
            handled, failed = interruptions.drain()
            handler_seconds = time.monotonic() - t1
            path_calls = Counter(calls)

            def all_resubmitted() -> bool:
                return len(system.scheduler.requests) >= 2 * len(jobs)

            t2 = time.monotonic()
            system.run_until(all_resubmitted, timeout=1800, every=0.05)
            system.pump()
            resubmit_seconds = time.monotonic() - t2
            attempts = Counter()
            for job_id in jobs:
                status = system.invoke_jobs({"action": "status", "job_id": job_id})["job"]
                attempts[len(status["attempts"])] += 1
            dead = system.dead_letters()
        finally:
            system.close()
    to_last = [
        max(t for t, _ in stops[h.instance_id]) - put_at[h.instance_id]
        for h in doomed
        if h.instance_id in stops
    ]
    stopped = Counter(arn for v in stops.values() for _, arn in v)
    return {
        "instances": instances,
        "tasks_per_instance": tasks,
        "setup_seconds": round(setup, 1),
        "warnings_put_within_seconds": round(put_span, 3),
        "notices_handled": handled,
        "failed_records": failed,
        "warning_to_last_stop_p50_s": round(percentile(to_last, 0.5), 3),
        "warning_to_last_stop_p99_s": round(percentile(to_last, 0.99), 3),
        "warning_to_last_stop_max_s": round(max(to_last), 3),
        "handler_ms_per_notice": round(1000 * handler_seconds / max(1, handled), 1),
        "aws_calls_per_instance": round(sum(path_calls.values()) / instances, 2),
        "aws_calls_per_instance_by_api": {k: round(v / instances, 2) for k, v in sorted(path_calls.items())},
        "every_task_stopped_once": len(stopped) == instances * tasks and set(stopped.values()) == {1},
        "every_job_resubmitted_once": attempts == Counter({2: len(jobs)}),
        "run_task_calls": len(system.scheduler.requests),
        "resubmission_seconds": round(resubmit_seconds, 1),
        "dead_letters": dead,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.pop("AWS_ENDPOINT_URL", None)
    r = run(args.instances, args.tasks)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(
        f"{r['instances']} instances x {r['tasks_per_instance']} managed tasks (set-up {r['setup_seconds']}s)"
    )
    print(
        f"  {r['notices_handled']} warnings put on the bus within {r['warnings_put_within_seconds']} s; "
        f"{r['failed_records']} failed records"
    )
    print(
        f"  warning -> last StopTask of its instance: p50 {r['warning_to_last_stop_p50_s']} s, "
        f"p99 {r['warning_to_last_stop_p99_s']} s, max {r['warning_to_last_stop_max_s']} s "
        "(one handler process; Lambda runs batches side by side)"
    )
    print(f"  handler time per notice: {r['handler_ms_per_notice']} ms")
    print(
        f"  AWS calls per instance on the interruption path: {r['aws_calls_per_instance']} "
        f"{r['aws_calls_per_instance_by_api']}"
    )
    print(
        f"  every task stopped exactly once: {r['every_task_stopped_once']}; "
        f"every job resubmitted exactly once: {r['every_job_resubmitted_once']} "
        f"({r['run_task_calls']} RunTask calls, resubmission took {r['resubmission_seconds']} s)"
    )
    print(f"  dead letters: {r['dead_letters']}")
    ok = (
        r["every_task_stopped_once"]
        and r["every_job_resubmitted_once"]
        and not any(r["dead_letters"].values())
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
