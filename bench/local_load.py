"""Load benchmark of the local stack: many instances interrupted at once, with Lambda's concurrency played.

N simulated spot instances (as many GPUs as managed tasks per instance: g5.xlarge for 1, g5.12xlarge for
4, g5.48xlarge for 8) each run their managed 1-GPU jobs (and N more instances are free to take them).
Their N spot interruption warnings are put on moto server's bus at once (10 per PutEvents, side by side).
The interruptions queue's event source mapping is played as Lambda runs it (emulator/lambdas.py,
`Scaling`): five batches at once, up to 300 more concurrent invocations a minute, capped by the template's
MaximumConcurrency / reserved concurrency, each invocation in an execution environment of its own; the
function handles a batch's records side by side. The tasks (simulated containers: they exit 75 a moment
after SIGTERM, as the agent does) stop, and every job is resubmitted.

Prints: the time from each warning to its instance's last StopTask (p50, p99, max); the AWS calls per
instance on the interruption path, by API, and those made before the instance's first StopTask; the CPU
time of this process per notice (what sizes the function's memory); the most invocations at once; and
checks that every task was stopped once, every job resubmitted once, nothing dead-lettered.

    .venv/bin/python bench/local_load.py [--instances 200] [--tasks 4] [--latency] [--isolated] [--json]

--latency: SpotGuard's AWS calls each wait as long as AWS might take (emulator/latency.py, the figures in
docs/benchmarks.md), so the result projects to AWS rather than to moto on 127.0.0.1. Everything runs on this
machine's cores (moto server in one process, every function in this one): where the cores are few or
shared, moto's throughput bounds the figures, which the output shows (calls per second).

--isolated: the projection to AWS. Every warning is put on the bus first; then the batches are handled one
at a time, each with the machine to itself (as every Lambda execution environment has a vCPU of its own,
and AWS's services do not slow down for a few hundred callers, where moto on two shared cores does), and
timed. `Scaling.schedule` then places the invocations as Lambda's pollers would (five at first, five more
a second), each new execution environment starting cold (the function's cold import, measured here in
fresh processes: bench/cold_start.py); a warning's time is where its last StopTask falls in its
invocation, so placed. With --latency, each event's way to the function is drawn too (EventBridge to
SQS, then the poller's receive: emulator/latency.py), and each call counts for its modelled latency alone:
the time a warning's path waited on moto alone (its scans, and its waits behind other callers: it answers
one call at a time), as the latency model notes it, is taken out of the warning's and its invocation's;
where calls go side by side, the group counts for its longest modelled latency. Without --latency, the
way to the function counts as nothing and each call as moto's time.

On a terminal (and without --json), progress is shown on stderr, phase by phase: hosts set up, jobs
submitted, tasks running, notices handled (an instance's notice counts once all its tasks have had their
StopTask, the end of what is measured), jobs resubmitted. stdout is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any

from cold_start import function_cold_import  # bench/cold_start.py

from spotguard.adapters import clients
from spotguard_cli.emulator.inject import make_event, put_entry
from spotguard_cli.emulator.lambdas import FunctionHost
from spotguard_cli.emulator.latency import LatencyModel, Served
from spotguard_cli.emulator.motoserver import MotoServer
from spotguard_cli.emulator.scaling import Invocation, Scaling
from spotguard_cli.emulator.system import LocalSystem
from spotguard_cli.progress import Bar, NoBar, progress

HOST_TYPES = {1: "g5.xlarge", 4: "g5.12xlarge", 8: "g5.48xlarge"}  # as many GPUs as tasks
SIGNALS = {"StopTask", "SendCommand"}
INSTANCE = re.compile(r"i-[0-9a-f]{17}")
SETUP_THREADS = 8
CONTEXT_KEY = "spotguard_bench_instance"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class CallLog:
    """Every AWS call SpotGuard's clients make, with the instance it is for (from its parameters: an
    instance id, or a container instance ARN of a known host)."""

    def __init__(self) -> None:
        self.on = False
        self.calls: list[tuple[float, str, str | None]] = []
        self.stopped: list[str] = []  # the task of every StopTask
        self.by_container_instance: dict[str, str] = {}
        self.task_instance: dict[str, str] = {}  # task ARN (and id) of a doomed host -> its instance
        self.tasks_per_instance = 0
        self.notices: Bar = NoBar()  # advanced once per instance whose tasks have all been stopped
        self._stopped_on: dict[str, set[str]] = defaultdict(set)
        self._lock = threading.Lock()

    def hook(self, model: Any, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if not self.on:
            return
        text = json.dumps(params, default=str)
        found = INSTANCE.search(text)
        who = found.group(0) if found else None
        if who is None:
            who = next((i for ci, i in self.by_container_instance.items() if ci in text), None)
        context[CONTEXT_KEY] = who  # so that the latency model's note of moto's time names the instance
        with self._lock:
            self.calls.append((time.monotonic(), model.name, who))
            if model.name == "StopTask":
                task = str(params.get("task"))
                self.stopped.append(task)
                instance = self.task_instance.get(task) or self.task_instance.get(task.rsplit("/", 1)[-1])
                if instance is not None:
                    on = self._stopped_on[instance]
                    before = len(on)
                    on.add(task)
                    if before < self.tasks_per_instance <= len(on):
                        self.notices.update()


def setup(
    system: LocalSystem, instances: int, tasks: int, phases: dict[str, float], show: bool = False
) -> tuple[list[Any], list[str]]:
    """The hosts (doomed ones first: binpacking fills them in order) and the jobs, side by side."""
    host_type = HOST_TYPES[tasks]
    t = time.monotonic()
    with (
        ThreadPoolExecutor(SETUP_THREADS) as pool,
        progress(2 * instances, "hosts set up", show, unit="host") as bar,
    ):
        doomed = []
        for host in pool.map(lambda _: system.add_host(host_type, "us-east-1a"), range(instances)):
            doomed.append(host)
            bar.update()
        for _ in pool.map(lambda _: system.add_host(host_type, "us-east-1b"), range(instances)):
            bar.update()
    system.pump()  # the container instance events: the index
    phases["hosts"], t = round(time.monotonic() - t, 1), time.monotonic()
    td = system.task_definition(["sim:checkpointing", "0.2"], gpus=1)
    jobs_fn = system.functions["JobsFunction"]
    environments = [jobs_fn] + [
        FunctionHost(system.stack, jobs_fn.fn, log=jobs_fn.log, fresh=True) for _ in range(SETUP_THREADS - 1)
    ]
    free = list(environments)
    lock = threading.Lock()

    def submit(i: int) -> str:
        with lock:
            env = free.pop()
        try:
            answer = env.invoke(
                {
                    "action": "submit",
                    "job_id": f"load-{i}",
                    "request": {"cluster": "gpu-spot", "taskDefinition": td},
                }
            )
        finally:
            with lock:
                free.append(env)
        assert answer["ok"], answer
        return str(answer["job"]["job_id"])

    want = instances * tasks
    with ThreadPoolExecutor(SETUP_THREADS) as pool, progress(want, "jobs submitted", show, unit="job") as bar:
        jobs = []
        for job_id in pool.map(submit, range(want)):
            jobs.append(job_id)
            bar.update()
    phases["submits"], t = round(time.monotonic() - t, 1), time.monotonic()
    deadline = time.monotonic() + 600
    with progress(want, "tasks running", show, unit="task") as bar:
        while time.monotonic() < deadline:  # the tasks start; their RUNNING events fill the hosts' index
            system.pump()
            bar.update(max(0, min(want, len(system.runner.running)) - bar.n))
            if len(system.runner.running) >= want and not any(_visible(p) for p in system.pollers):
                break
    phases["tasks running and indexed"] = round(time.monotonic() - t, 1)
    return doomed, jobs


def _visible(poller: Any) -> int:
    attrs = poller.sqs.get_queue_attributes(
        QueueUrl=poller.queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used so far, from /proc; None where there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _count_visible(poller: Any) -> int:
    attrs = poller.sqs.get_queue_attributes(
        QueueUrl=poller.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"])


def moto_bound(calls: list[Served], until: float) -> float:
    """Seconds before `until` in which an instance's path waited on moto alone: some call of it in moto
    and none in its modelled wait. Calls go side by side (ListTasks beside the task index, the stops
    beside the drain) and moto answers one at a time, so a call's time in moto may be spent while
    another's modelled latency runs; only the time nothing but moto held the path is taken out, which
    leaves each group of side-by-side calls its longest modelled latency, as on AWS."""
    points = sorted({p for c in calls for p in (c.began, c.sent, c.ended) if p < until} | {until})
    bound = 0.0
    for lo, hi in pairwise(points):
        mid = (lo + hi) / 2
        if any(c.sent <= mid < c.ended for c in calls) and not any(c.began <= mid < c.sent for c in calls):
            bound += hi - lo
    return bound


def project(
    invocations: list[Invocation],
    put: dict[str, float],
    arrive: dict[str, float],
    last_stop: dict[str, float],
    scaling: Scaling,
    cold_seconds: float,
    in_moto: dict[str, list[Served]] | None = None,
) -> tuple[dict[str, float], list[float]]:
    """Warning to last StopTask per instance (seconds), the invocations placed by `scaling.schedule`, and
    the invocations' durations as placed. `put` and `arrive`: when each instance's warning was put on the
    bus and when its record reached the poller (seconds on one clock); `last_stop`: the time.monotonic()
    of its last StopTask, in its invocation timed alone. `in_moto`: per instance, its calls as the latency
    model noted them; the time its path waited on moto alone (`moto_bound`) is taken out of its time, so
    that each call counts for its modelled latency, as on AWS, and not for moto's scans on top of it."""
    in_moto = in_moto or {}

    def away(instance: str, until: float) -> float:
        return moto_bound(in_moto.get(instance, []), until)

    owners = [[m.group(0) for m in map(INSTANCE.search, inv.bodies) if m] for inv in invocations]
    durations = []
    for inv, who in zip(invocations, owners, strict=True):
        # the invocation lasts as long as its slowest record (they run side by side), without moto
        ends = {i: max(c.ended for c in in_moto[i]) for i in who if in_moto.get(i)}
        if not ends:
            durations.append(inv.ended - inv.started)
            continue
        tail = inv.ended - max(ends.values())
        durations.append(max(end - inv.started - away(i, end) for i, end in ends.items()) + tail)
    placed = scaling.schedule(
        [max((arrive[i] for i in who), default=0.0) for who in owners], durations, cold_seconds
    )
    times: dict[str, float] = {}
    for inv, who, (start, cold) in zip(invocations, owners, placed, strict=True):
        begun = start + (cold_seconds if cold else 0.0)
        for i in who:
            if i in last_stop:
                times[i] = begun + (last_stop[i] - inv.started - away(i, last_stop[i])) - put[i]
    return times, durations


def run(
    instances: int, tasks: int, latency: bool, isolated: bool = False, show: bool = False
) -> dict[str, Any]:
    """The benchmark; `show`: progress on stderr (when it is a terminal)."""
    if tasks not in HOST_TYPES:
        raise SystemExit(f"--tasks must be one of {sorted(HOST_TYPES)} (instance types with that many GPUs)")
    work = Path(tempfile.mkdtemp(prefix="spotguard-load-"))
    log = CallLog()
    with MotoServer(log_path=str(work / "moto.log")) as moto:
        system = LocalSystem(moto.endpoint, work, reconcile_every=3600)
        try:
            for poller in system.pollers:
                poller.concurrent = True  # Lambda's concurrency, for every queue
            clients.on_every_call(log.hook)
            t = time.monotonic()
            phases: dict[str, float] = {}
            doomed, jobs = setup(system, instances, tasks, phases, show)
            setup_seconds = time.monotonic() - t
            placed = Counter(system.scheduler.placed.values())
            assert all(placed[h.container_instance_arn] == tasks for h in doomed), "jobs not on doomed hosts"
            log.by_container_instance = {h.container_instance_arn: h.instance_id for h in doomed}
            for task, where in system.scheduler.placed.items():
                if where in log.by_container_instance:
                    instance = log.by_container_instance[where]
                    log.task_instance[task] = log.task_instance[task.rsplit("/", 1)[-1]] = instance
            log.tasks_per_instance = tasks
            model = LatencyModel().install() if latency else None

            interruptions = system.pollers[0]
            assert "Interruptions" in interruptions.queue_arn
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

            notices = log.notices = progress(instances, "notices handled", show, unit="notice")
            log.on = True
            cpu0 = time.process_time()
            moto_cpu0 = process_cpu(moto.proc.pid) if moto.proc else None
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=min(32, len(batches))) as pool:  # as the warnings come
                list(pool.map(put, batches))
            put_span = time.monotonic() - t0
            invocations: list[Invocation] = []
            if isolated:  # every record in the queue, then one invocation at a time (see --isolated)
                while _count_visible(interruptions) < instances and time.monotonic() - t0 < 120:
                    time.sleep(0.05)
                invocations, failed = interruptions.drain_one_by_one()
                while _visible(interruptions):  # a failed record comes back after its visibility timeout
                    time.sleep(0.5)
                    more, f = interruptions.drain_one_by_one()
                    invocations, failed = invocations + more, failed + f
                handled = sum(len(inv.bodies) for inv in invocations)
            else:
                handled, failed = interruptions.drain()
                while _visible(interruptions):  # a failed record comes back after its visibility timeout
                    time.sleep(0.5)
                    n, f = interruptions.drain()
                    handled, failed = handled + n, failed + f
            handler_seconds = time.monotonic() - t0
            cpu = time.process_time() - cpu0
            moto_cpu1 = process_cpu(moto.proc.pid) if moto.proc else None
            moto_cpu = moto_cpu1 - moto_cpu0 if moto_cpu0 is not None and moto_cpu1 is not None else None
            log.on = False
            notices.close()
            if model is not None:
                model.enabled = False  # the resubmissions are not what is measured
            calls = list(log.calls)

            resubmitted = progress(len(jobs), "jobs resubmitted", show, unit="job")

            def all_resubmitted() -> bool:
                done = min(len(jobs), max(0, len(system.scheduler.requests) - len(jobs)))
                resubmitted.update(done - resubmitted.n)
                return len(system.scheduler.requests) >= 2 * len(jobs)

            t2 = time.monotonic()
            with resubmitted:
                system.run_until(all_resubmitted, timeout=1800, every=0.05)
            system.pump()
            resubmit_seconds = time.monotonic() - t2
            attempts: Counter[int] = Counter()
            for job_id in jobs:
                status = system.invoke_jobs({"action": "status", "job_id": job_id})["job"]
                attempts[len(status["attempts"])] += 1
            dead = system.dead_letters()
            run_tasks = len(system.scheduler.requests)
            peak = interruptions.peak_concurrency
            scaling = interruptions.scaling
        finally:
            system.close()

    per_instance: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for at, name, who in calls:
        if who is not None:
            per_instance[who].append((at, name))
    stops = {i: [at for at, name in cs if name == "StopTask"] for i, cs in per_instance.items()}
    to_last = [max(stops[h.instance_id]) - put_at[h.instance_id] for h in doomed if stops.get(h.instance_id)]
    projection: dict[str, Any] = {}
    if isolated:  # the figures are the projection: the invocations placed on Lambda's schedule
        put = {i: at - t0 for i, at in put_at.items()}
        # without the model, the way from the bus to the poller is taken as nothing (loopback)
        arrive = {i: put[i] + model.delivery() if model else put[i] for i in put}
        last_stop = {i: max(ts) for i, ts in stops.items() if ts}
        in_moto: dict[str, list[Served]] = defaultdict(list)
        for served in model.served if model else []:
            who = served.context.get(CONTEXT_KEY)
            if who is not None:
                in_moto[who].append(served)
        cold_seconds = function_cold_import("interruptions")
        times, durations = project(invocations, put, arrive, last_stop, scaling, cold_seconds, in_moto)
        to_last = list(times.values())
        warm = list(project(invocations, put, arrive, last_stop, scaling, 0.0, in_moto)[0].values())
        walls = [inv.ended - inv.started for inv in invocations]
        moto_seconds = [c.seconds for calls in in_moto.values() for c in calls]
        taken_out = [moto_bound(calls, last_stop[i]) for i, calls in in_moto.items() if i in last_stop]
        projection = {
            "invocations": len(invocations),
            "invocation_wall_p50_s": round(percentile(walls, 0.5), 3),
            "invocation_p50_s": round(percentile(durations, 0.5), 3),
            "invocation_max_s": round(max(durations), 3),
            "moto_ms_per_call": round(1000 * sum(moto_seconds) / len(moto_seconds), 1)
            if moto_seconds
            else None,
            # what moto_bound took out of each warning's time: its path waiting on moto alone
            "moto_s_taken_out_p50": round(percentile(taken_out, 0.5), 3) if taken_out else None,
            "cold_start_s": round(cold_seconds, 3),
            "warm_p50_s": round(percentile(warm, 0.5), 3) if warm else None,
            "warm_p99_s": round(percentile(warm, 0.99), 3) if warm else None,
        }
    before: Counter[str] = Counter()
    for h in doomed:
        cs = per_instance.get(h.instance_id, [])
        first = min((at for at, name in cs if name in SIGNALS), default=None)
        if first is not None:
            before.update(name for at, name in cs if at < first)
    by_api = Counter(name for _, name, _ in calls)
    stopped = Counter(log.stopped)
    return {
        "instances": instances,
        "tasks_per_instance": tasks,
        "latency_model": latency,
        "isolated": isolated,
        "projection": projection,
        "setup_seconds": round(setup_seconds, 1),
        "setup_phases_seconds": phases,
        "warnings_put_within_seconds": round(put_span, 3),
        "notices_handled": handled,
        "failed_records": failed,
        "warning_to_last_stop_p50_s": round(percentile(to_last, 0.5), 3) if to_last else None,
        "warning_to_last_stop_p99_s": round(percentile(to_last, 0.99), 3) if to_last else None,
        "warning_to_last_stop_max_s": round(max(to_last), 3) if to_last else None,
        "all_notices_handled_seconds": round(handler_seconds, 2),
        "cpu_ms_per_notice": round(1000 * cpu / max(1, instances), 1),
        "moto_cpu_ms_per_notice": None if moto_cpu is None else round(1000 * moto_cpu / max(1, instances), 1),
        # no burst of N notices can be handled here in less than the CPU it takes over the machine's cores
        "cpu_floor_s": round((cpu + (moto_cpu or 0.0)) / (os.cpu_count() or 1), 2),
        "aws_calls_per_second": round(len(calls) / max(handler_seconds, 1e-9)),
        "peak_concurrent_invocations": peak,
        "concurrency_limit": scaling.limit,
        "aws_calls_per_instance": round(len(calls) / instances, 2),
        "aws_calls_per_instance_by_api": {k: round(v / instances, 2) for k, v in sorted(by_api.items())},
        "calls_before_first_stop_per_instance": {
            k: round(v / instances, 2) for k, v in sorted(before.items())
        },
        "every_task_stopped_once": len(stopped) == instances * tasks and set(stopped.values()) == {1},
        "every_job_resubmitted_once": attempts == Counter({2: len(jobs)}),
        "run_task_calls": run_tasks,
        "resubmission_seconds": round(resubmit_seconds, 1),
        "dead_letters": dead,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--latency", action="store_true", help="AWS's call latencies (emulator/latency.py)")
    parser.add_argument(
        "--isolated", action="store_true", help="each invocation timed alone, placed on Lambda's schedule"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.pop("AWS_ENDPOINT_URL", None)
    r = run(args.instances, args.tasks, args.latency, args.isolated, show=not args.json)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        latency = "with AWS's call latencies (--latency)" if r["latency_model"] else "moto on 127.0.0.1"
        print(
            f"{r['instances']} instances x {r['tasks_per_instance']} managed tasks, {latency} "
            f"(set-up {r['setup_seconds']} s: {r['setup_phases_seconds']})"
        )
        print(
            f"  {r['notices_handled']} warnings put on the bus within {r['warnings_put_within_seconds']} s; "
            f"{r['failed_records']} failed records; all handled in {r['all_notices_handled_seconds']} s"
        )
        pr = r["projection"]
        print(
            f"  warning -> last StopTask of its instance{' (projected)' if pr else ''}: "
            f"p50 {r['warning_to_last_stop_p50_s']} s, "
            f"p99 {r['warning_to_last_stop_p99_s']} s, max {r['warning_to_last_stop_max_s']} s"
        )
        if pr:
            without_moto = (
                f"; without the time they waited on moto alone, p50 {pr['moto_s_taken_out_p50']} s "
                f"a warning, {pr['moto_ms_per_call']} ms a call in moto, which is "
                f"{pr['invocation_wall_p50_s']} s p50 with it"
                if pr["moto_ms_per_call"] is not None
                else ""
            )
            print(
                f"  projected: {pr['invocations']} invocations, each timed alone (p50 "
                f"{pr['invocation_p50_s']} s, max {pr['invocation_max_s']} s{without_moto}), placed as "
                f"Lambda's pollers would (limit {r['concurrency_limit']}), every new environment cold "
                f"({pr['cold_start_s']} s, the function's cold import); with warm environments: "
                f"p50 {pr['warm_p50_s']} s, "
                f"p99 {pr['warm_p99_s']} s"
            )
            print(
                f"  CPU per notice: {r['cpu_ms_per_notice']} ms in this process (the functions and the "
                f"harness), {r['moto_cpu_ms_per_notice']} ms in moto server"
            )
        else:
            print(
                f"  Lambda's concurrency played: up to {r['peak_concurrent_invocations']} invocations at "
                f"once (limit {r['concurrency_limit']}); {r['aws_calls_per_second']} AWS calls/s; "
                f"CPU per notice {r['cpu_ms_per_notice']} ms in this process (the functions and the "
                f"harness), {r['moto_cpu_ms_per_notice']} ms in moto server: no run on this machine's "
                f"{os.cpu_count()} cores can handle them all in less than {r['cpu_floor_s']} s"
            )
        print(f"  AWS calls per instance: {r['aws_calls_per_instance']} {r['aws_calls_per_instance_by_api']}")
        print(f"  of which before the instance's first StopTask: {r['calls_before_first_stop_per_instance']}")
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
