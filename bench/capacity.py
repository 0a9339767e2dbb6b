"""Capacity policies on the "Can't Be Late" traces (docs/traces.md): the issue #5 benchmark.

1. All five policies on the eight traces, first 13 days, 300 starts each, C=48 h, R=60 h, d=0.2 h: the
   paper's Table 3 (greedy 30.8, uniform progress 25.1, omniscient 20.7 on-demand hours), and how much
   of uniform progress's gap to omniscient SpotGuard closes.
2. The deadline swept from 52 to 96 hours (fewer starts: the planner's work grows with the slack).
3. us-west-2a and us-west-2b V100 (1 GPU) as pools at once, against uniform progress on any pool and on
   the best single pool; then with us-west-2b K80 (1 GPU) as a third pool (the policy plans over two
   of the three at a time).
4. How far the policy's model can go: the same plan, but with each job's history replaced by the
   trace of the job's own 60 hours (undecayed). That is an oracle, not a policy: it knows how long runs
   will last over the job, though not when each starts. What it closes bounds what better estimates of
   this model (hazards by run age) could close; the rest needs a model that sees more.
5. Held out: 1 and 3 again with starts only in days 13 to 27 of the traces, which the table (like the
   paper) leaves out and on which none of the policy's constants was chosen; each job has all the
   trace before its start as history. The nearest thing here to the traces we do not have.

On a terminal, each section shows its progress on stderr (runs done, time left); stdout is the same.

The traces are read from .traces/ (make traces); when they are missing they are fetched first.

    .venv/bin/python bench/capacity.py [--samples 300] [--sweep-samples 40] [--ceiling-samples 40]
                                       [--holdout-samples 100] [--seed 1]
                                       [--only table|sweep|multi|ceiling|holdout]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import traces as trace_files  # bench/traces.py: the fetcher and its lock

from spotguard.domain.capacity.simulated import SpotGuardPolicy
from spotguard_cli.progress import echo, progress
from spotguard_cli.simulate import draw_starts, summarise
from spotguard_cli.simulate import hours_cell as hours
from spotguard_cli.simulator import Job, Prices, Trace, load_trace, simulate

TRACES = trace_files.DEST
POLICIES = ("on-demand", "greedy", "uniform-progress", "spotguard", "omniscient")
NAMES = tuple(Path(n).stem for n in sorted(trace_files.read_lock()["files"]))
PRICES = Prices()
HOLDOUT_HOURS = 13 * 24  # the table's starts are in the first 13 days; the held-out ones after them


def closed(sg: float, up: float, omni: float) -> str:
    return f"{(up - sg) / (up - omni):.1%}" if up > omni else "n/a"


def load(names: Sequence[str], holdout: bool) -> list[Trace]:
    """The first 13 days of each trace (the paper's Table 3), or the whole of it for held-out starts."""
    traces = [load_trace(TRACES / f"{n}.json") for n in names]
    return traces if holdout else [t.head(HOLDOUT_HOURS) for t in traces]


def table(samples: int, seed: int, holdout: bool = False) -> None:
    traces = load(NAMES, holdout)
    job = Job(48.0, 60.0, 0.2)
    earliest = HOLDOUT_HOURS if holdout else 0.0
    runs = draw_starts(traces, job, samples, seed, multi_pool=False, earliest_hours=earliest)
    if holdout:
        print(f"\n## Held out: 8 traces x {samples} starts in days 13-27, C=48 R=60 d=0.2 (seed {seed})")
    else:
        print(f"## Table 3: 8 traces x {samples} starts, C=48 R=60 d=0.2 (seed {seed})")
    print(
        f"{'policy':18} {'OD h':>6} {'spot h':>6} {'cost $':>8} {'misses':>6} {'launches':>8} {'seconds':>8}"
        f" {'done h':>6} {'idle h':>6}"
    )
    res = {}
    with progress(len(POLICIES) * len(runs), "held out" if holdout else "table", unit="run") as bar:
        for p in POLICIES:
            r = res[p] = summarise(p, traces, runs, job, PRICES, bar=bar)
            echo(
                f"{p:18} {r['mean_ondemand_hours']:6.2f} {r['mean_spot_hours']:6.2f} {r['mean_cost']:8.2f} "
                f"{r['deadline_misses']:6d} {r['mean_launches']:8.1f} {r['seconds']:8.1f}"
                f" {hours(r['mean_hours_to_finish'])} {r['mean_idle_with_spot_hours']:6.2f}",
                flush=True,
            )
    up, omni, sg = (res[p]["mean_cost"] for p in ("uniform-progress", "omniscient", "spotguard"))
    print(f"spotguard closes {closed(sg, up, omni)} of uniform progress's gap to omniscient (goal: 50%)")
    print("per trace, mean cost: uniform-progress / spotguard / omniscient (closed)")
    for a, b, c in zip(
        *(res[p]["pools"] for p in ("uniform-progress", "spotguard", "omniscient")), strict=True
    ):
        print(
            f"  {a['traces'][0]:22} {a['mean_cost']:8.2f} {b['mean_cost']:8.2f} {c['mean_cost']:8.2f}"
            f"  ({closed(b['mean_cost'], a['mean_cost'], c['mean_cost'])})"
        )


def sweep(samples: int, seed: int) -> None:
    traces = load(NAMES, holdout=False)
    print(f"\n## Deadline sweep: 8 traces x {samples} starts, C=48 d=0.2, mean cost $ (misses)")
    print(f"{'R':>4} " + " ".join(f"{p:>18}" for p in POLICIES) + "   closed")
    deadlines = (52, 56, 60, 66, 72, 84, 96)
    with progress(len(deadlines) * len(POLICIES) * samples * len(traces), "sweep", unit="run") as bar:
        for r_hours in deadlines:
            job = Job(48.0, float(r_hours), 0.2)
            runs = draw_starts(traces, job, samples, seed, multi_pool=False)
            res = {p: summarise(p, traces, runs, job, PRICES, bar=bar) for p in POLICIES}
            cells = " ".join(
                f"{res[p]['mean_cost']:12.2f} ({res[p]['deadline_misses']:3d})" for p in POLICIES
            )
            up, omni, sg = (res[p]["mean_cost"] for p in ("uniform-progress", "omniscient", "spotguard"))
            echo(f"{r_hours:4d} {cells}   {closed(sg, up, omni)}", flush=True)


def multi(samples: int, seed: int, names: tuple[str, ...], holdout: bool = False) -> None:
    traces = load(names, holdout)
    job = Job(48.0, 60.0, 0.2)
    earliest = HOLDOUT_HOURS if holdout else 0.0
    runs = draw_starts(traces, job, samples, seed, multi_pool=True, earliest_hours=earliest)
    when = " in days 13-27 (held out)" if holdout else ""
    print(f"\n## {len(names)} pools at once ({', '.join(names)}), {samples} starts{when}, C=48 R=60 d=0.2")
    policies = ("uniform-progress", "spotguard", "omniscient")
    desc = f"{len(names)} pools{' held out' if holdout else ''}"
    with progress((len(policies) + len(traces)) * len(runs), desc, unit="run") as bar:
        res = {p: summarise(p, traces, runs, job, PRICES, bar=bar) for p in policies}
        for p, r in res.items():
            echo(
                f"{p + ' (any pool)':30} cost {r['mean_cost']:7.2f}  OD h {r['mean_ondemand_hours']:5.2f}"
                f"  misses {r['deadline_misses']}  done h {hours(r['mean_hours_to_finish'])}"
                f"  idle h {r['mean_idle_with_spot_hours']:.2f}"
            )
        singles = []
        for i, t in enumerate(traces):
            one = [type(run)((0,), run.start) for run in runs]  # the same start times, one pool
            r = summarise("uniform-progress", [t], one, job, PRICES, bar=bar)
            singles.append(r["mean_cost"])
            echo(f"{'uniform-progress on ' + names[i]:30} cost {r['mean_cost']:7.2f}")
    up, omni, sg = (res[p]["mean_cost"] for p in ("uniform-progress", "omniscient", "spotguard"))
    best = min(singles)
    print(
        f"spotguard closes {closed(sg, up, omni)} of the gap (goal 50%); {1 - sg / best:.1%} cheaper than "
        f"uniform progress on the best single pool (goal 10%)"
    )


def _window_oracle_cost(args: tuple[Trace, int, Job]) -> float:
    trace, start, job = args
    policy = SpotGuardPolicy(PRICES.spot, PRICES.on_demand, half_life_hours=1e9)
    window = trace.available[start : start + round(job.deadline_hours / trace.gap_hours)]
    policy.remember([window], recent=False)  # run lengths only: the current run's age is not given
    return simulate(policy, [trace], start, job, PRICES).cost


def ceiling(samples: int, seed: int) -> None:
    traces = load(NAMES, holdout=False)
    job = Job(48.0, 60.0, 0.2)
    runs = draw_starts(traces, job, samples, seed, multi_pool=False)
    print(f"\n## How far the model can go: 8 traces x {samples} starts, C=48 R=60 d=0.2 (seed {seed})")
    policies = ("uniform-progress", "spotguard", "omniscient")
    with progress((len(policies) + 1) * len(runs), "ceiling", unit="run") as bar:
        res = {p: summarise(p, traces, runs, job, PRICES, bar=bar)["mean_cost"] for p in policies}
        costs = []
        with ProcessPoolExecutor(min(os.cpu_count() or 1, 8)) as pool:
            for cost in pool.map(_window_oracle_cost, [(traces[r.pools[0]], r.start, job) for r in runs]):
                costs.append(cost)
                bar.update()
    res["spotguard, model from the job's own window (oracle)"] = sum(costs) / len(costs)
    up, omni = res["uniform-progress"], res["omniscient"]
    for name, cost in res.items():
        print(f"{name:52} cost {cost:7.2f}  closed {closed(cost, up, omni)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--sweep-samples", type=int, default=40)
    ap.add_argument("--ceiling-samples", type=int, default=40)
    ap.add_argument("--holdout-samples", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", choices=("table", "sweep", "multi", "ceiling", "holdout"))
    args = ap.parse_args()
    if not trace_files.ready(TRACES):
        try:  # on stderr, so stdout is the same whether they were fetched or not
            print(trace_files.fetch(TRACES, trace_files.default_source()), file=sys.stderr)
        except trace_files.TraceError as e:
            print(f"no traces at {TRACES} ({e}): run `make traces`", file=sys.stderr)
            return 2
    v100 = ("us-west-2a_v100_1", "us-west-2b_v100_1")
    if args.only in (None, "table"):
        table(args.samples, args.seed)
    if args.only in (None, "sweep"):
        sweep(args.sweep_samples, args.seed)
    if args.only in (None, "multi"):
        multi(args.samples, args.seed, v100)
        multi(args.samples, args.seed, (*v100, "us-west-2b_k80_1"))
    if args.only in (None, "ceiling"):
        ceiling(args.ceiling_samples, args.seed)
    if args.only in (None, "holdout"):
        table(args.holdout_samples, args.seed, holdout=True)
        multi(args.holdout_samples, args.seed, v100, holdout=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
