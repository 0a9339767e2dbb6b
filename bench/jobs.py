"""Benchmark of the job path: AWS calls and handler milliseconds per step of a job's life.

Runs the stack's functions in-process against moto (in-process too), on the world the tests use
(cli/spotguard_cli/emulator/world.py). Prints, for 1-, 4- and 8-GPU jobs: the calls and time of a submit, of a
task's RUNNING event, of the STOPPED event of an interrupted task up to the RunTask that resubmits it;
and the time to apply a burst of task events for many jobs (every event delivered 5 times, shuffled).
Times include moto's own processing of every call: an upper bound on SpotGuard's part, and only ratios
within one run mean anything on a shared machine.

    .venv/bin/python bench/jobs.py [--jobs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections import Counter
from typing import Any

from moto import mock_aws
from moto.moto_api import state_manager

from spotguard.adapters import clients
from spotguard_cli.emulator.world import JobsWorld, make_jobs_world

os.environ.update(
    {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
)
os.environ.pop("AWS_ENDPOINT_URL", None)  # moto in this process, never an endpoint
DEVNULL = open(os.devnull, "w")  # noqa: SIM115  (the functions' logs)


def _world() -> tuple[JobsWorld, list[str]]:
    state_manager.set_transition("ecs::task", {"progression": "manual", "times": 10**9})
    world = make_jobs_world(log=DEVNULL)
    calls: list[str] = []
    clients.on_every_call(lambda model, **_: calls.append(model.name))
    return world, calls


def _measure(calls: list[str], fn: Any) -> tuple[float, Counter[str]]:
    calls.clear()
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000, Counter(calls)


def life_of_a_job(gpus: int) -> dict[str, Any]:
    with mock_aws():
        w, calls = _world()
        td = w.cluster.gpu_task_definition(gpus=gpus)
        payload = {
            "action": "submit",
            "request": {"cluster": "gpu-spot", "taskDefinition": td, "launchType": "EC2"},
        }
        holder: dict[str, Any] = {}
        ms_submit, c_submit = _measure(calls, lambda: holder.update(w.invoke(payload)))
        job = holder["job"]
        arn = job["task_arn"]
        running = w.event(arn)
        ms_running, c_running = _measure(calls, lambda: (w.put(running), w.task_events.drain()))
        w.commit_checkpoint(job, 1)
        w.stop(arn, "SpotGuard: spot-interruption bench on i-0123456789abcdef0")
        stopped = w.event(arn, exit_code=75)
        ms_stop, c_stop = _measure(calls, lambda: (w.put(stopped), w.task_events.drain()))
        assert c_stop["RunTask"] == 1, c_stop
        # The test harness's own calls (PutEvents, SQS) are not the function's: count the function's.
        harness = {"PutEvents", "ReceiveMessage", "DeleteMessageBatch", "SendMessage"}
        own = {k: v for k, v in c_stop.items() if k not in harness}
        clients.reset()
    return {
        "gpus": gpus,
        "submit_ms": round(ms_submit, 1),
        "submit_calls": sum(v for k, v in c_submit.items() if k not in harness),
        "running_event_ms": round(ms_running, 1),
        "running_event_calls": sum(v for k, v in c_running.items() if k not in harness),
        "stopped_to_runtask_ms": round(ms_stop, 1),
        "stopped_to_runtask_calls": sum(own.values()),
        "stopped_calls_by_api": own,
    }


def burst(jobs: int, seed: int = 7) -> dict[str, Any]:
    """`jobs` jobs, each interrupted once: their RUNNING and STOPPED events, 5 copies each, shuffled."""
    rng = random.Random(seed)
    with mock_aws():
        w, _ = _world()
        for h in ("a1", "b1"):  # room for every job's two attempts
            for _ in range(jobs // 2):
                w.cluster.add_host("g5.xlarge", "us-east-1a" if h == "a1" else "us-east-1b")
        submitted = [w.submit(gpus=1) for _ in range(jobs)]
        events = []
        for job in submitted:
            arn = job["task_arn"]
            events.append(w.event(arn))
            w.stop(arn, "SpotGuard: spot-interruption bench on i-0123456789abcdef0")
            events.append(w.event(arn, exit_code=75))
        copies = events * 5
        rng.shuffle(copies)
        runs_before = len(w.scheduler.requests)
        for e in copies:
            w.put(e)
        t = time.perf_counter()
        delivered, failed = w.task_events.drain()
        elapsed = time.perf_counter() - t
        resubmitted = len(w.scheduler.requests) - runs_before
        states = Counter(w.status(j["job_id"])["state"] for j in submitted)
        clients.reset()
    return {
        "jobs": jobs,
        "events_delivered": delivered,
        "failed_records": failed,
        "seconds": round(elapsed, 2),
        "events_per_second": round(delivered / elapsed, 1),
        "run_tasks_for_resubmission": resubmitted,
        "end_states": dict(states),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20, help="jobs in the burst (default 20)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [life_of_a_job(g) for g in (1, 4, 8)]
    b = burst(args.jobs)
    if args.json:
        print(json.dumps({"life": rows, "burst": b}, indent=2))
        return
    head = f"{'GPUs':>4} {'submit':>16} {'RUNNING event':>16} {'STOPPED -> RunTask':>20}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['gpus']:>4} {r['submit_calls']:>4} calls {r['submit_ms']:>5.0f} ms"
            f" {r['running_event_calls']:>4} calls {r['running_event_ms']:>5.0f} ms"
            f" {r['stopped_to_runtask_calls']:>6} calls {r['stopped_to_runtask_ms']:>5.0f} ms"
        )
    print(f"\nSTOPPED -> RunTask, calls by API: {rows[0]['stopped_calls_by_api']}")
    print(
        f"\nburst: {b['jobs']} interrupted jobs, {b['events_delivered']} task events "
        "(each 5 times, shuffled) "
        f"in {b['seconds']} s = {b['events_per_second']} events/s; {b['failed_records']} failed records; "
        f"{b['run_tasks_for_resubmission']} RunTask for resubmission; end states {b['end_states']}"
    )
    median = statistics.median(r["stopped_to_runtask_ms"] for r in rows)
    print(f"median STOPPED -> RunTask: {median:.0f} ms")


if __name__ == "__main__":
    main()
