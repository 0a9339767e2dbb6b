"""How long one capacity decision takes: `choose_capacity` for random jobs on 4 pools, the plan of today
and the plan of commit 389ee7e (before its work was bounded) in the same run, and the cold import the
core layer pays for numpy. Run it on one core, as a Lambda of 1,769 MB has:

    taskset -c 0 .venv/bin/python bench/decide.py [--jobs 100] [--seed 1] [--old-limit 30]

The jobs: 1 to 48 hours of work, a restart overhead of 3 to 30 minutes, 1 GPU; 15% without a deadline,
the others with a deadline from tight (on-demand just makes it) to 200 hours, a few beyond; each on 4
pools of 1 GPU per instance with their own prices, spot available now or not, half of them with a history
of a week of random availability (runs of random mean length), the others none; the job holds nothing,
spot in a pool that has it, or on-demand. The old plan is loaded from git (`git show
389ee7e:layers/core/spotguard/domain/planner.py`) into a temporary module; its cases predicted to take
longer than --old-limit seconds (from its work, calibrated on the cases it ran) are skipped and counted.
Times are scaled to Lambda memory sizes by the CPU share, memory / 1,769 MB of a core. On a terminal, the
cases done (and the time left) are shown on stderr; stdout is the same.

`--horizons` instead times one decision as the deadline goes far off (issue 29: 1e6 h left took 10 s and
650 MB): two fresh pools with spot, 5 h of work (a 0.2 h restart), and 10 h, 1e3, 1e5 and 1e6 h left, and
the furthest deadline the jobs function accepts (`MAX_DEADLINE_HOURS`) with the work estimated at 5 h or
not estimated (half the time to it, 4,380 h). Each decision runs in a fresh process, after one warm-up
decision: its time, then its peak memory (tracemalloc, numpy's arrays included, in a second run of it)
and the process's peak resident set. `--before COMMIT` runs the same on that commit's core layer too
(from git, into a temporary folder), each decision given at most --limit seconds (120):

    taskset -c 0 .venv/bin/python bench/decide.py --horizons [--before 0ca3ef4~1]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from spotguard.domain.capacity import planner
from spotguard.domain.capacity.model import Market, slack_grid
from spotguard.domain.jobs.model import MAX_DEADLINE_HOURS
from spotguard.domain.jobs.placement import job_needs
from spotguard_cli.progress import Bar, NoBar, progress

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "389ee7e"
TICK = 1 / 6
MEMORY_MB = (512, 1024, 1769)


def load_old() -> ModuleType:
    """Commit 389ee7e's planner, from git, as a module of its own (no copy of it lives in the tree)."""
    src = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:layers/core/spotguard/domain/planner.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # its one import of the core, at today's name (issue 46 moved domain/capacity.py into a package)
    src = src.replace("from spotguard.domain.capacity import", "from spotguard.domain.capacity.model import")
    path = Path(tempfile.mkdtemp()) / f"planner_{OLD_COMMIT}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"planner_{OLD_COMMIT}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def availability(rng: random.Random, ticks: int) -> list[bool]:
    """Runs of random mean length (10 minutes to a day), alternating."""
    mean_on, mean_off = rng.uniform(1, 144), rng.uniform(1, 36)
    out: list[bool] = []
    a = rng.random() < 0.5
    while len(out) < ticks:
        out += [a] * max(1, round(rng.expovariate(1 / (mean_on if a else mean_off))))
        a = not a
    return out[:ticks]


def draw(rng: random.Random) -> dict[str, Any]:
    work = rng.uniform(1.0, 48.0)
    restart = rng.uniform(0.05, 0.5)
    u = rng.random()
    if u < 0.15:
        deadline = None
    elif u < 0.2:
        deadline = work + restart + rng.uniform(200.0, 300.0)  # beyond 200 hours
    else:
        top = max(1.0, 200.0 - work - restart)
        deadline = work + restart + math.exp(rng.uniform(math.log(0.1), math.log(top)))
    pools = []
    for i in range(4):
        od = rng.choice((1.006, 1.212, 3.06, 3.912))
        pools.append(
            {
                "name": f"pool-{i}",
                "spot_price": od * rng.uniform(0.25, 0.7),
                "on_demand_price": od,
                "available": rng.random() < 0.6,
                "history": availability(rng, 7 * 144) if rng.random() < 0.5 else None,
                "score": rng.choice((None, None, 3, 7, 9)),
            }
        )
    placement = rng.choice((Market.NONE, Market.NONE, Market.SPOT, Market.ON_DEMAND))
    up = [p["name"] for p in pools if p["available"]]
    pool = rng.choice(up) if placement is Market.SPOT and up else None
    if placement is Market.SPOT and pool is None:
        placement = Market.NONE
    return {
        "work": work,
        "restart": restart,
        "deadline": deadline,
        "pools": pools,
        "placement": placement,
        "pool": pool,
    }


def build(module: ModuleType, case: dict[str, Any]) -> tuple[Any, list[Any]]:
    pools = []
    for p in case["pools"]:
        history = None
        if p["history"] is not None:
            history = module.AvailabilityHistory(TICK)
            history.observe_all(p["history"])
        pools.append(
            module.PoolOption(
                p["name"], 1, p["spot_price"], p["on_demand_price"], p["available"], history, p["score"]
            )
        )
    job = module.JobNeeds(
        gpus=1,
        work_left_hours=case["work"],
        restart_hours=case["restart"],
        time_left_hours=case["deadline"],
        placement=case["placement"],
        pool=case["pool"],
    )
    return job, pools


def timed(module: ModuleType, case: dict[str, Any]) -> tuple[float, Any]:
    job, pools = build(module, case)
    t0 = time.perf_counter()
    decision = module.choose_capacity(job, pools, TICK)
    return time.perf_counter() - t0, decision


def old_work(case: dict[str, Any]) -> float:
    """The old joint plan's work: ticks x slack units x (classes x joint states)."""
    if case["deadline"] is None:
        return 0.0
    k = slack_grid(TICK, case["restart"])
    d = round(case["restart"] / (TICK / k))
    nr = len({max(0, d - j * k) for j in range(1, d // k + 2)} | {0})
    ticks = round(case["deadline"] / TICK)
    slack = max(0.0, (case["deadline"] - case["work"]) / (TICK / k))
    return ticks * (slack + 1) * (1 + 3 * nr) * 144


def quantiles(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    s = sorted(xs)
    p99 = s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]
    return f"p50 {statistics.median(s):7.3f} s  p99 {p99:7.3f} s  max {s[-1]:7.3f} s"


def cold_import(statement: str, runs: int, bar: Bar | None = None) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    bar = NoBar() if bar is None else bar
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
        times.append(float(out))
        bar.update()
    return statistics.median(times)


# One decision in a fresh process (argv: hours left, hours of work): a warm-up decision first, then the
# one timed, then the same again under tracemalloc for its peak memory; prints its seconds, that peak
# (MiB), the process's peak resident set (MiB, imports included) and the answer.
HORIZON_CODE = """
import json, resource, sys, time, tracemalloc
from spotguard.domain.capacity.planner import JobNeeds, PoolOption, choose_capacity
left, work = float(sys.argv[1]), float(sys.argv[2])
pools = [PoolOption("a", 1, 1.0, 3.06, True), PoolOption("b", 1, 1.1, 3.06, True)]
job = JobNeeds(1, work, 0.2, left)
choose_capacity(JobNeeds(1, 1.0, 0.2, 30.0), pools)
t = time.perf_counter()
d = choose_capacity(job, pools)
seconds = time.perf_counter() - t
tracemalloc.start()
choose_capacity(job, pools)
peak = tracemalloc.get_traced_memory()[1] / 2**20
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
answer = f"{d.placement.value} {d.pool or ''}".strip()
print(json.dumps({"seconds": seconds, "peak_mb": peak, "rss_mb": rss, "answer": answer}))
"""


def horizon_cases() -> list[tuple[str, float, float]]:
    """(label, hours left, hours of work) for `--horizons`; the door's cases as job_needs asks them."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    door = now + timedelta(hours=MAX_DEADLINE_HOURS)
    cases = [(f"{left:g} h left", left, 5.0) for left in (10.0, 1e3, 1e5, 1e6)]
    for label, estimate in (("5 h of work", 5.0), ("no estimate", None)):
        needs = job_needs(1, [], [], estimate, now, door, now)
        assert needs.time_left_hours is not None
        cases.append((f"door's max, {label}", needs.time_left_hours, needs.work_left_hours))
    return cases


def decide_in(core: Path | None, left: float, work: float, limit: float) -> dict[str, Any] | None:
    """One decision in a fresh process on `core` (a layers/core folder; None: this tree's); None if it
    ran past `limit` seconds."""
    env = dict(os.environ)
    if core is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(core), env.get("PYTHONPATH", "")])
    try:
        out = subprocess.run(
            [sys.executable, "-c", HORIZON_CODE, str(left), str(work)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=limit,
        ).stdout
    except subprocess.TimeoutExpired:
        return None
    return dict(json.loads(out))


def core_at(commit: str) -> Path:
    """The core layer of `commit`, from git, in a temporary folder (its layers/core)."""
    root = Path(tempfile.mkdtemp())
    archive = subprocess.run(
        ["git", "archive", commit, "layers/core/spotguard"], cwd=REPO, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root / "layers" / "core"


def horizons(before: str | None, limit: float) -> int:
    cases = horizon_cases()
    runs: list[tuple[str, Path | None]] = [("now", None)]
    if before:
        runs.append((before, core_at(before)))
    print("## one decision as the deadline goes far off: 2 fresh pools, 0.2 h restart, a fresh process each")
    head = (
        f"{'case':26} {'left h':>9} {'work h':>7}  {'code':10} {'seconds':>8} {'peak MiB':>8} {'RSS MiB':>8}"
    )
    print(f"{head}  answer")
    with progress(len(cases) * len(runs), "decisions", unit="case") as bar:
        for label, left, work in cases:
            for name, core in runs:
                r = decide_in(core, left, work, limit)
                bar.update()
                if r is None:
                    print(f"{label:26} {left:9.0f} {work:7.0f}  {name:10} {'> ' + format(limit, 'g'):>8}")
                    continue
                print(
                    f"{label:26} {left:9.0f} {work:7.0f}  {name:10} {r['seconds']:8.3f} {r['peak_mb']:8.1f} "
                    f"{r['rss_mb']:8.0f}  {r['answer']}",
                    flush=True,
                )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--old-limit", type=float, default=30.0, help="skip old cases predicted longer (s)")
    ap.add_argument("--import-runs", type=int, default=7)
    ap.add_argument("--horizons", action="store_true", help="time one decision as the deadline goes far off")
    ap.add_argument("--before", metavar="COMMIT", help="with --horizons: that commit's core layer too")
    ap.add_argument("--limit", type=float, default=120.0, help="with --horizons: seconds a decision may take")
    args = ap.parse_args()
    if args.horizons:
        return horizons(args.before, args.limit)
    rng = random.Random(args.seed)
    cases = [draw(rng) for _ in range(args.jobs)]
    timed(planner, cases[0])  # warm: numpy's first calls

    new_times: list[float] = []
    answers: dict[str, int] = {}
    with progress(len(cases), "choose_capacity now", unit="case") as bar:
        for case in cases:
            dt, decision = timed(planner, case)
            new_times.append(dt)
            answers[decision.placement.value] = answers.get(decision.placement.value, 0) + 1
            bar.update()
    print(f"## choose_capacity, {args.jobs} random jobs x 4 pools, one decision each (seed {args.seed})")
    print(f"now          {quantiles(new_times)}   answers {answers}")
    loose = [t for t, c in zip(new_times, cases, strict=True) if c["deadline"] and c["deadline"] > 100]
    print(f"  deadline > 100 h ({len(loose)} jobs): {quantiles(loose)}", flush=True)

    old = load_old()
    old_times: list[float] = []
    rate: float | None = None  # seconds per unit of the old plan's work, from the largest case it ran
    skipped = 0
    with progress(
        len(cases), f"choose_capacity {OLD_COMMIT}", unit="case"
    ) as bar:  # a case skipped counts as done
        for case in sorted(cases, key=old_work):  # small first: the calibration comes from them
            work = old_work(case)
            if rate is not None and work * rate > args.old_limit:
                skipped += 1
                bar.update()
                bar.set_postfix_str(f"{skipped} skipped")
                continue
            dt, _ = timed(old, case)
            bar.update()
            old_times.append(dt)
            if work > 0:
                rate = dt / work
    print(
        f"{OLD_COMMIT}      {quantiles(old_times)}   on the {len(old_times)} jobs it took at most "
        f"~{args.old_limit:g} s for; {skipped} skipped as longer (p99 and max of all would be higher)"
    )
    print("\n## the same, scaled to a Lambda's CPU share (memory / 1,769 MB of a core)")
    for mb in MEMORY_MB:
        scale = 1769 / mb
        print(f"{mb:5d} MB   now  {quantiles([t * scale for t in new_times])}")

    print(f"\n## cold import, fresh processes, median of {args.import_runs}")
    imports = (
        ("spotguard.domain.capacity.model (no numpy)", "import spotguard.domain.capacity.model"),
        ("spotguard.domain.capacity.planner (numpy)", "import spotguard.domain.capacity.planner"),
        ("numpy alone", "import numpy"),
    )
    for label, stmt in imports:
        with progress(args.import_runs, f"import {label.split()[0]}", unit="run") as bar:
            seconds = cold_import(stmt, args.import_runs, bar)
        print(f"{label:40} {seconds * 1000:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
