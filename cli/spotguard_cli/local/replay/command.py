"""`spotguard local replay`: the whole local stack on the clock of real spot availability traces, and what
it costs beside what `spotguard simulate` says for the same policy, traces and starts.

The stack (moto server on 127.0.0.1, every function, the pollers, the reconcile schedule) runs on one
scaled clock (`--time-scale` wall-clock seconds per trace hour) that starts at the trace's first tick;
the pools follow the traces (replay/world.py); N jobs (replay/task.py, with the real agent) are
submitted at the start times `spotguard simulate --seed S --samples N` draws (pools together), each
with `work_hours` C and a deadline R hours after its start. While no job is live (before the first, between
them, after the last) the clock jumps from tick to tick instead of waiting, playing only the pools'
events, so the run takes about N x R x the time scale of wall-clock time, not the trace's length.

The result per job and in total: cost (the job's own spend: each attempt's hours at its pool's price,
restart overheads included), deadline met or missed, launches, interruptions, moves, work redone, beside
the simulator's cost and launches for the same start (`--json` prints both, and the proof).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotguard_cli import arguments
from spotguard_cli.local import shared
from spotguard_cli.local.replay.report import live_row, render, sim_row, summary
from spotguard_cli.local.replay.schedule import run_live

if TYPE_CHECKING:
    from spotguard_cli.simulator import Job, Trace

STATE_DIR = shared.STATE_DIR / "replay"


def add_parser(actions: Any) -> None:
    r = actions.add_parser(
        "replay",
        help="the local stack on real spot traces: the live system's cost beside the simulator's",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--trace", action="append", required=True, metavar="FILE", help="a spot pool; repeat")
    r.add_argument(
        "--jobs", type=arguments.count, required=True, metavar="N", help="jobs, at the seed's starts"
    )
    r.add_argument("--job-hours", type=arguments.positive("--job-hours"), required=True, metavar="C")
    r.add_argument(
        "--deadline-hours", type=arguments.positive("--deadline-hours"), required=True, metavar="R"
    )
    r.add_argument(
        "--restart-hours",
        type=arguments.positive("--restart-hours", strict=False),
        required=True,
        metavar="D",
    )
    r.add_argument("--seed", type=arguments.seed, required=True, metavar="S")
    r.add_argument(
        "--clock",
        choices=("virtual", "wall"),
        default="virtual",
        help="virtual (default): every function in this process on one virtual clock, the tasks modelled, "
        "the same run every time; wall: the local stack on a scaled wall clock with real task processes",
    )
    r.add_argument(
        "--time-scale",
        type=arguments.positive("--time-scale"),
        default=None,
        metavar="SECONDS_PER_TRACE_HOUR",
        help="with --clock wall: wall-clock seconds per hour of the trace (default 4: a 60-hour deadline "
        "in 4 minutes)",
    )
    r.add_argument("--json", action="store_true", help="the result, the simulator's and the proof as JSON")
    r.set_defaults(run=run)
    arguments.one_line_errors(r, "spotguard local replay")


def run(args: argparse.Namespace) -> int:
    from spotguard_cli.simulator import Job, TraceError, load_trace  # numpy: only when a replay runs

    try:
        if args.clock == "virtual" and args.time_scale is not None:
            raise ValueError("--time-scale is for --clock wall (the virtual clock takes no wall time)")
        traces = [load_trace(path) for path in args.trace]
        job = Job(args.job_hours, args.deadline_hours, args.restart_hours)
        scale = None if args.clock == "virtual" else args.time_scale or 4.0
        check(traces, job, scale)
    except (TraceError, ValueError) as exc:
        print(f"spotguard local replay: {exc}", file=sys.stderr)
        return 2
    if scale is None:
        shared.same_hash_seed()  # the same seed, the same run: string hashing too
        shared.quiet_moto()
    say = (lambda _: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    result = replay(traces, job, args.jobs, args.seed, scale, STATE_DIR, say)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
    return 0 if result["ok"] else 1


def check(traces: list[Trace], job: Job, seconds_per_hour: float | None) -> None:
    from spotguard_cli.local.replay.world import ZONES
    from spotguard_cli.simulator import check_job

    check_job(job, traces)
    if len(traces) > len(ZONES):
        raise ValueError(f"at most {len(ZONES)} traces (one zone each), not {len(traces)}")
    if seconds_per_hour is not None and not 0.5 <= seconds_per_hour <= 3600:
        raise ValueError(
            f"--time-scale must be within [0.5, 3600] seconds per trace hour, not {seconds_per_hour:g}"
        )
    if len({t.name for t in traces}) < len(traces):
        raise ValueError("the same trace twice")


# ================================================================================== the replay
def replay(
    traces: list[Trace],
    job: Job,
    n_jobs: int,
    seed: int,
    seconds_per_hour: float | None,
    work: Path,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Run the replay (on the virtual clock when `seconds_per_hour` is None, else on the scaled wall clock)
    and the simulator for the same starts; the result as `render` and --json show it."""
    from spotguard_cli.simulate import draw_starts, run_one
    from spotguard_cli.simulator import Prices

    prices = Prices()
    runs = draw_starts(traces, job, n_jobs, seed, multi_pool=len(traces) > 1)
    simulated = [run_one("spotguard", traces, r, job, prices) for r in runs]
    starts = [r.start for r in runs]
    if seconds_per_hour is None:
        from spotguard_cli.local.replay.virtual import run_virtual  # the simulator's pools: numpy

        live, works, facts = run_virtual(traces, job, starts, prices, seed, work, say)
    else:
        live, facts = run_live(traces, job, starts, seconds_per_hour, prices, work, say)
        works = [None for _ in live]
    rows = []
    for r, sim, lj, w in zip(runs, simulated, live, works, strict=True):
        rows.append(
            {"start_hours": round(r.start * traces[0].gap_hours, 2), **live_row(lj, w), **sim_row(sim)}
        )
    return summary(rows, traces, job, n_jobs, seed, seconds_per_hour, facts)
