"""The live system on the Can't Be Late traces (issue 19): `spotguard local replay` on each pair of traces of
one GPU type in two zones (2 pools at once) and on each trace alone, C=48 h, R=60 h, D=0.2 h, with the
simulator's cost for the same policy, traces and starts beside it. Not in CI: on the virtual clock (the
default) a run takes a few minutes of this machine's time (the functions' own work), so the whole bench with
2 jobs a run is about 50 minutes alone, or less with --parallel; on the wall clock (--clock wall) each job
takes about R x --time-scale seconds, about 1.5 hours in all.

    .venv/bin/python bench/replay.py [--jobs 2] [--seed 1] [--clock virtual|wall] [--time-scale 4]
        [--only pairs|singles] [--parallel N]

Each replay runs as its own `spotguard local replay --json` process, in a directory of its own; the table
prints in order as each finishes, then the totals: the live mean cost against the simulator's, misses,
lost steps. On the virtual clock the figures are the same whatever the load and --parallel.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import traces as trace_files  # bench/traces.py: the fetcher and its lock

TRACES = trace_files.DEST
PAIRS = [("us-west-2a_v100_1", "us-west-2b_v100_1"), ("us-west-2a_k80_1", "us-west-2b_k80_1")]
PAIRS += [("us-west-2a_v100_8", "us-west-2b_v100_8"), ("us-west-2a_k80_8", "us-west-2b_k80_8")]
SINGLES = [(name,) for pair in PAIRS for name in pair]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--clock", choices=["virtual", "wall"], default="virtual")
    p.add_argument("--time-scale", type=float, default=4.0, help="with --clock wall")
    p.add_argument("--only", choices=["pairs", "singles"])
    p.add_argument(
        "--parallel", type=int, default=1, help="replays at once (virtual-clock figures do not move)"
    )
    args = p.parse_args(argv)
    if not trace_files.ready(TRACES):
        print(trace_files.fetch(TRACES, trace_files.default_source()), file=sys.stderr)
    groups = {"pairs": PAIRS, "singles": SINGLES}
    runs = [g for key, gs in groups.items() if args.only in (None, key) for g in gs]
    print(
        f"spotguard local replay, C=48 R=60 D=0.2, {args.jobs} job(s) a run, seed {args.seed}, "
        + ("on the virtual clock\n" if args.clock == "virtual" else f"{args.time_scale:g} s per trace hour\n")
    )
    print(f"{'traces':<40} {'live $':>8} {'sim $':>8} {'diff':>7} {'missed':>6} {'lost':>5} {'wall s':>7}")
    results = []

    def one(group: tuple[str, ...]) -> tuple[tuple[str, ...], subprocess.CompletedProcess[str], float]:
        command = [sys.executable, "-m", "spotguard_cli.main", "local", "replay"]
        for name in group:
            command += ["--trace", str((TRACES / f"{name}.json").resolve())]
        command += ["--jobs", str(args.jobs), "--job-hours", "48", "--deadline-hours", "60"]
        command += ["--restart-hours", "0.2", "--seed", str(args.seed), "--clock", args.clock]
        if args.clock == "wall":
            command += ["--time-scale", f"{args.time_scale:g}"]
        began = time.monotonic()
        # each run in a directory of its own: its logs (.local-stack/replay/) beside no other run's
        with tempfile.TemporaryDirectory(prefix="bench-replay-") as work:
            proc = subprocess.run([*command, "--json"], capture_output=True, text=True, cwd=work)
        return group, proc, time.monotonic() - began

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        for group, proc, seconds in pool.map(one, runs):
            if proc.returncode not in (0, 1) or not proc.stdout.strip():
                print(f"{' + '.join(group):<40} failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(proc.stdout)
            results.append(r)
            missed = sum(1 for row in r["rows"] if not row["met"])
            lost = sum(1 for row in r["rows"] if row["lost_committed_step"])
            live = f"{r['mean_cost']:.2f}" if r["mean_cost"] is not None else "-"
            diff = f"{(r['cost_ratio'] - 1) * 100:+.1f}%" if r["cost_ratio"] else "-"
            print(
                f"{' + '.join(group):<40} {live:>8} {r['sim_mean_cost']:>8.2f} {diff:>7} {missed:>6} "
                f"{lost:>5} {seconds:>7.0f}",
                flush=True,
            )
    rows = [row for r in results for row in r["rows"]]
    priced = [row for row in rows if row["cost"] is not None]
    if priced:
        live = sum(row["cost"] for row in priced) / len(priced)
        sim = sum(row["sim_cost"] for row in priced) / len(priced)
        missed = sum(1 for row in rows if not row["met"])
        sim_missed = sum(1 for row in rows if not row["sim_met"])
        lost = sum(1 for row in rows if row["lost_committed_step"])
        launches = sum(row["launches"] for row in rows)
        sim_launches = sum(row["sim_launches"] for row in rows)
        print(
            f"\nall {len(rows)} jobs: live mean ${live:.2f}, simulator ${sim:.2f} "
            f"({(live / sim - 1) * 100:+.1f}%); missed {missed} (simulator {sim_missed}); "
            f"lost committed steps {lost}; launches {launches} (simulator {sim_launches})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
