"""`spotguard simulate`: run capacity policies on real spot availability traces.

Without --multi-pool each trace is a pool of its own and N start times are drawn in each; with it the
traces are simultaneous alternatives (cut to the shortest) and N start times are drawn once. The
spotguard policy is given each pool's availability before the start as its history (as if SpotGuard had
been watching the pool); the others ignore it. Runs are spread over the machine's cores. On a terminal,
progress (runs done, time left) is shown on stderr, except with --json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spotguard.domain.capacity.model import (
    CapacityPolicy,
    GreedyPolicy,
    OnDemandPolicy,
    UniformProgressPolicy,
)
from spotguard_cli.arguments import count as _count
from spotguard_cli.arguments import one_line_errors, picture_file
from spotguard_cli.arguments import positive as _positive
from spotguard_cli.arguments import seed as _seed
from spotguard_cli.progress import Bar, NoBar, progress

if TYPE_CHECKING:  # the simulator loads numpy: imported where a run needs it, not to build the CLI's parser
    from spotguard_cli.simulator import Job, Prices, RunResult, Trace

POLICIES = ("on-demand", "greedy", "uniform-progress", "spotguard", "omniscient")


def make_policy(name: str, prices: Prices) -> CapacityPolicy:
    if name == "on-demand":
        return OnDemandPolicy()
    if name == "greedy":
        return GreedyPolicy()
    if name == "uniform-progress":
        return UniformProgressPolicy()
    if name == "spotguard":
        from spotguard.domain.capacity.simulated import SpotGuardPolicy  # numpy: loaded only when asked for

        return SpotGuardPolicy(spot_price=prices.spot, on_demand_price=prices.on_demand)
    raise ValueError(f"unknown policy {name!r}")


@dataclass(frozen=True)
class Run:
    """One simulated job: which pools (trace indexes), from which tick."""

    pools: tuple[int, ...]
    start: int


def draw_starts(
    traces: Sequence[Trace],
    job: Job,
    samples: int,
    seed: int,
    multi_pool: bool,
    earliest_hours: float = 0.0,
) -> list[Run]:
    """N start times per trace (or once for all pools), each leaving room for the whole deadline, none
    before `earliest_hours` (the trace before that is only history: a benchmark on a later stretch)."""
    from spotguard_cli.simulator import TraceError, check_job

    check_job(job, traces)
    gap = traces[0].gap_hours
    ticks = math.ceil(job.deadline_hours / gap - 1e-9)
    first = math.ceil(earliest_hours / gap - 1e-9)
    rng = random.Random(seed)
    groups = [tuple(range(len(traces)))] if multi_pool else [(i,) for i in range(len(traces))]
    runs = []
    for group in groups:
        length = min(len(traces[i].available) for i in group)
        if length < first + ticks:
            names = ", ".join(traces[i].name for i in group)
            need = f"the deadline needs {job.deadline_hours:g} h"
            if first:
                total = earliest_hours + job.deadline_hours
                need = f"a start after {earliest_hours:g} h and the deadline need {total:g} h"
            raise TraceError(f"{names}: {length * gap:g} h of trace, {need}")
        runs += [Run(group, first + rng.randrange(0, length - first - ticks + 1)) for _ in range(samples)]
    return runs


def run_one(policy: str, traces: Sequence[Trace], run: Run, job: Job, prices: Prices) -> RunResult:
    from spotguard_cli.simulator import omniscient, simulate

    pools = [traces[i] for i in run.pools]
    if policy == "omniscient":
        return omniscient(pools, run.start, job, prices)
    p = make_policy(policy, prices)
    remember = getattr(p, "remember", None)
    if remember is not None:
        remember([t.available[: run.start] for t in pools])
    return simulate(p, pools, run.start, job, prices)


# cost, on-demand hours, spot hours, launches, missed, hours to finish (None: missed), idle with spot
Row = tuple[float, float, float, int, bool, float | None, float]


def _worker(args: tuple[str, Sequence[Trace], Run, Job, Prices]) -> Row:
    r = run_one(*args)
    return (
        r.cost,
        r.ondemand_hours,
        r.spot_hours,
        r.launches,
        r.missed,
        r.finished_hours,
        r.idle_with_spot_hours,
    )


def _chunk_worker(chunk: Sequence[tuple[str, Sequence[Trace], Run, Job, Prices]]) -> list[Row]:
    return [_worker(t) for t in chunk]


def summarise(
    policy: str,
    traces: Sequence[Trace],
    runs: Sequence[Run],
    job: Job,
    prices: Prices,
    workers: int | None = None,
    bar: Bar | None = None,
) -> dict[str, Any]:
    """Run `policy` on every run and return the figures of the JSON contract (and per-trace ones).
    `bar` (spotguard_cli.progress) is advanced by one for every run done, as the workers hand them back."""
    t0 = time.monotonic()
    bar = NoBar() if bar is None else bar
    tasks = [(policy, traces, r, job, prices) for r in runs]
    workers = workers or min(os.cpu_count() or 1, 8)
    if workers > 1 and len(tasks) > 8:
        size = max(1, len(tasks) // (workers * 8))
        chunks = [tasks[i : i + size] for i in range(0, len(tasks), size)]
        done: list[list[Row]] = [[] for _ in chunks]
        with ProcessPoolExecutor(workers) as pool:
            futures = {pool.submit(_chunk_worker, c): i for i, c in enumerate(chunks)}
            for future in as_completed(futures):  # in the order they finish; kept in the runs' order
                rows = done[futures[future]] = future.result()
                bar.update(len(rows))
        results = [row for rows in done for row in rows]
    else:
        results = []
        for t in tasks:
            results.append(_worker(t))
            bar.update()
    all_on_demand = prices.on_demand * (job.hours + job.restart_hours)

    def figures(rows: Sequence[Row]) -> dict[str, Any]:
        n = len(rows)
        cost = sum(r[0] for r in rows) / n
        finished = [r[5] for r in rows if r[5] is not None]
        return {
            "runs": n,
            "deadline_misses": sum(1 for r in rows if r[4]),
            "mean_cost": round(cost, 4),
            "mean_ondemand_hours": round(sum(r[1] for r in rows) / n, 4),
            "mean_spot_hours": round(sum(r[2] for r in rows) / n, 4),
            "mean_launches": round(sum(r[3] for r in rows) / n, 3),
            "cost_vs_ondemand": round(cost / all_on_demand, 4),
            # time, which the cost does not see: hours to finish (runs that finished), and hours the job
            # ran on nothing while some pool had spot
            "mean_hours_to_finish": round(sum(finished) / len(finished), 4) if finished else None,
            "mean_idle_with_spot_hours": round(sum(r[6] for r in rows) / n, 4),
        }

    by_pools: dict[tuple[int, ...], list[Row]] = {}
    for run, row in zip(runs, results, strict=True):
        by_pools.setdefault(run.pools, []).append(row)
    return {
        "policy": policy,
        **figures(results),
        "seconds": round(time.monotonic() - t0, 2),
        "pools": [
            {"traces": [traces[i].name for i in key], **figures(rows)} for key, rows in by_pools.items()
        ],
    }


# ------------------------------------------------------------------------------------------------ CLI
# the argument types are spotguard_cli.arguments'


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="run capacity policies on spot availability traces",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--policy", action="append", choices=POLICIES, required=True, help="repeat to compare")
    p.add_argument("--trace", action="append", required=True, metavar="FILE", help="repeat for more traces")
    p.add_argument("--multi-pool", action="store_true", help="the traces are simultaneous alternative pools")
    for flag, metavar, strict, about in (
        ("--job-hours", "C", True, "the job's work, in hours"),
        ("--deadline-hours", "R", True, "hours from the job's start to its deadline (R >= C)"),
        (
            "--restart-hours",
            "D",
            False,
            "hours each restart costs (an instance booted, the checkpoint restored)",
        ),
    ):
        p.add_argument(flag, type=_positive(flag, strict=strict), required=True, metavar=metavar, help=about)
    p.add_argument("--samples", type=_count, required=True, metavar="N", help="start times per trace")
    p.add_argument(
        "--seed", type=_seed, required=True, metavar="S", help="draws the start times: same seed, same run"
    )
    # default: the simulator's Prices, filled in when it runs
    p.add_argument(
        "--spot-price",
        type=_positive("--spot-price"),
        metavar="P",
        help="spot $ an hour (default the simulator's)",
    )
    p.add_argument(
        "--ondemand-price",
        type=_positive("--ondemand-price"),
        metavar="Q",
        help="on-demand $ an hour (default the simulator's)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object (a list for several policies)")
    p.add_argument(
        "--plot",
        type=picture_file,
        metavar="FILE",
        help="draw mean cost against the deadline for the chosen policies (.png, .svg or .pdf)",
    )
    p.set_defaults(run=run)
    one_line_errors(p, "spotguard simulate")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ValueError as exc:  # a TraceError is one
        print(f"spotguard simulate: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from spotguard_cli.simulator import Job, Prices, load_trace

    traces = [load_trace(path) for path in args.trace]
    spot = Prices.spot if args.spot_price is None else args.spot_price
    on_demand = Prices.on_demand if args.ondemand_price is None else args.ondemand_price
    if spot > on_demand:
        raise ValueError("--spot-price is above --ondemand-price")
    job = Job(args.job_hours, args.deadline_hours, args.restart_hours)
    prices = Prices(spot, on_demand)
    policies = list(dict.fromkeys(args.policy))
    runs = draw_starts(traces, job, args.samples, args.seed, args.multi_pool)
    show = not args.json  # progress on stderr, on a terminal only (progress() checks)
    with progress(len(policies) * len(runs), "simulate", show, unit="run") as bar:
        results = [summarise(p, traces, runs, job, prices, bar=bar) for p in policies]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        print(render_table(results, job, args.multi_pool))
    if args.plot:
        plot(args.plot, policies, traces, job, prices, args.samples, args.seed, args.multi_pool, show)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def render_table(results: Sequence[dict[str, Any]], job: Job, multi_pool: bool) -> str:
    head = (
        f"C={job.hours:g} h, R={job.deadline_hours:g} h, d={job.restart_hours:g} h"
        f"{', pools together' if multi_pool else ''}"
    )
    lines = [
        head,
        f"{'policy':18} {'runs':>5} {'misses':>6} {'cost $':>8} {'OD h':>6} {'spot h':>6} {'vs OD':>6} "
        f"{'done h':>6} {'idle h':>6}",
    ]
    for r in results:
        lines.append(
            f"{r['policy']:18} {r['runs']:5d} {r['deadline_misses']:6d} {r['mean_cost']:8.2f} "
            f"{r['mean_ondemand_hours']:6.2f} {r['mean_spot_hours']:6.2f} {r['cost_vs_ondemand']:6.3f} "
            f"{hours_cell(r['mean_hours_to_finish'])} {r['mean_idle_with_spot_hours']:6.2f}"
        )
    lines.append("done h: mean hours to finish; idle h: mean hours idle while some pool had spot")
    return "\n".join(lines)


def hours_cell(value: float | None) -> str:
    """A mean of hours in a 6-wide column; '-' when no run finished."""
    return f"{value:6.2f}" if value is not None else f"{'-':>6}"


def deadline_points(job: Job, traces: Sequence[Trace]) -> list[float]:
    """Deadlines to plot: from tight to twice the job, with the one asked for, within the traces."""
    longest = min(len(t.available) for t in traces) * traces[0].gap_hours
    tight = job.hours + job.restart_hours + 2 * traces[0].gap_hours
    points = {round(job.deadline_hours, 3)} | {
        round(job.hours * f, 3) for f in (1.1, 1.25, 1.5, 1.75, 2.0) if job.hours * f >= tight
    }
    return sorted(p for p in points if p <= longest)


def plot(
    path: str,
    policies: Sequence[str],
    traces: Sequence[Trace],
    job: Job,
    prices: Prices,
    samples: int,
    seed: int,
    multi_pool: bool,
    show_progress: bool = False,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spotguard_cli.simulator import Job

    deadlines = deadline_points(job, traces)
    starts = {
        r: draw_starts(traces, Job(job.hours, r, job.restart_hours), samples, seed, multi_pool)
        for r in deadlines
    }
    fig, ax = plt.subplots(figsize=(7, 4.5))
    total = len(policies) * sum(len(runs) for runs in starts.values())
    with progress(total, "plot", show_progress, unit="run") as bar:
        for policy in policies:
            costs = []
            for r, runs in starts.items():
                j = Job(job.hours, r, job.restart_hours)
                costs.append(summarise(policy, traces, runs, j, prices, bar=bar)["mean_cost"])
            ax.plot(deadlines, costs, marker="o", label=policy)
    ax.set_xlabel("deadline (hours)")
    ax.set_ylabel("mean cost ($)")
    n = len(traces)
    where = (
        f"{n} pools at once, {samples} starts"
        if multi_pool
        else f"{n} trace{'s' if n > 1 else ''}, {samples} starts each"
    )
    ax.set_title(f"{job.hours:g} h job, {job.restart_hours:g} h restart, {where}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
