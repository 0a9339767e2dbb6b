"""The live system on the Can't Be Late traces (issue 19): `spotguard local replay` on each pair of traces of
one GPU type in two zones (2 pools at once) and on each trace alone, C=48 h, R=60 h, D=0.2 h, with the
simulator's cost for the same policy, traces and starts beside it. Not in CI: on the virtual clock (the
default) a run takes a few minutes of this machine's time (the functions' own work), so the whole bench with
2 jobs a run is about 50 minutes alone, or less with --parallel; on the wall clock (--clock wall) each job
takes about R x --time-scale seconds, about 1.5 hours in all.

    .venv/bin/python bench/replay.py [--jobs 2] [--seed 1[,2,...]] [--clock virtual|wall] [--time-scale 4]
        [--only pairs|singles] [--parallel N]

Each replay runs as its own `spotguard local replay --json` process, in a directory of its own; the table
prints in order as each finishes, then the totals: the live mean cost against the simulator's, misses,
lost steps. On the virtual clock the figures are the same whatever the load and --parallel.

Where spot comes and goes every hour or so, one seed is one sample: a few milliseconds of modelled latency
more or less before one decision sends a job to on-demand or keeps it on spot, and the rest of its run
follows. `--seed 1,2,3` runs every replay once per seed (other starts, other latencies) and ends with each
run's figures over its seeds (pooled: the mean cost over every priced job of every seed, live against the
simulator's) and its spread (the lowest and highest difference of one seed), then each seed's totals.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import traces as trace_files  # bench/traces.py: the fetcher and its lock

TRACES = trace_files.DEST
PAIRS = [("us-west-2a_v100_1", "us-west-2b_v100_1"), ("us-west-2a_k80_1", "us-west-2b_k80_1")]
PAIRS += [("us-west-2a_v100_8", "us-west-2b_v100_8"), ("us-west-2a_k80_8", "us-west-2b_k80_8")]
SINGLES = [(name,) for pair in PAIRS for name in pair]


def seeds(text: str) -> list[int]:
    """`1` or `1,2,3`: the seeds, each a whole number of 0 or more, none twice."""
    try:
        out = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a seed or a comma-separated list of seeds"
        ) from None
    if any(s < 0 for s in out) or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"{text!r}: seeds are whole numbers of 0 or more, each once")
    return out


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=positive, default=2)
    p.add_argument(
        "--seed", type=seeds, default=[1], help="one seed, or several: 1,2,3 (each run once a seed)"
    )
    p.add_argument("--clock", choices=["virtual", "wall"], default="virtual")
    p.add_argument("--time-scale", type=float, default=4.0, help="with --clock wall")
    p.add_argument("--only", choices=["pairs", "singles"])
    p.add_argument(
        "--parallel", type=positive, default=1, help="replays at once (virtual-clock figures do not move)"
    )
    args = p.parse_args(argv)
    if not trace_files.ready(TRACES):
        print(trace_files.fetch(TRACES, trace_files.default_source()), file=sys.stderr)
    groups = {"pairs": PAIRS, "singles": SINGLES}
    runs = [
        (g, seed) for key, gs in groups.items() if args.only in (None, key) for g in gs for seed in args.seed
    ]
    print(
        f"spotguard local replay, C=48 R=60 D=0.2, {args.jobs} job(s) a run, "
        f"seed{'s' if len(args.seed) > 1 else ''} {','.join(map(str, args.seed))}, "
        + ("on the virtual clock\n" if args.clock == "virtual" else f"{args.time_scale:g} s per trace hour\n")
    )
    print(
        f"{'traces':<40} {'seed':>4} {'live $':>8} {'sim $':>8} {'diff':>7} {'missed':>6} {'lost':>5} "
        f"{'wall s':>7}"
    )
    results: list[tuple[tuple[str, ...], int, dict[str, Any]]] = []

    def one(run: tuple[tuple[str, ...], int]) -> tuple[subprocess.CompletedProcess[str], float]:
        group, seed = run
        command = [sys.executable, "-m", "spotguard_cli.main", "local", "replay"]
        for name in group:
            command += ["--trace", str((TRACES / f"{name}.json").resolve())]
        command += ["--jobs", str(args.jobs), "--job-hours", "48", "--deadline-hours", "60"]
        command += ["--restart-hours", "0.2", "--seed", str(seed), "--clock", args.clock]
        if args.clock == "wall":
            command += ["--time-scale", f"{args.time_scale:g}"]
        began = time.monotonic()
        # each run in a directory of its own: its logs (.local-stack/replay/) beside no other run's
        with tempfile.TemporaryDirectory(prefix="bench-replay-") as work:
            proc = subprocess.run([*command, "--json"], capture_output=True, text=True, cwd=work)
        return proc, time.monotonic() - began

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        for (group, seed), (proc, seconds) in zip(runs, pool.map(one, runs), strict=True):
            if proc.returncode not in (0, 1) or not proc.stdout.strip():
                print(f"{' + '.join(group):<40} {seed:>4} failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(proc.stdout)
            results.append((group, seed, r))
            missed = sum(1 for row in r["rows"] if not row["met"])
            lost = sum(1 for row in r["rows"] if row["lost_committed_step"])
            live = f"{r['mean_cost']:.2f}" if r["mean_cost"] is not None else "-"
            diff = f"{(r['cost_ratio'] - 1) * 100:+.1f}%" if r["cost_ratio"] else "-"
            print(
                f"{' + '.join(group):<40} {seed:>4} {live:>8} {r['sim_mean_cost']:>8.2f} {diff:>7} "
                f"{missed:>6} {lost:>5} {seconds:>7.0f}",
                flush=True,
            )
    for line in report(results, args.seed):
        print(line)
    return 0


def totals(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The jobs' figures together: mean live and simulator cost over the jobs both priced, the live
    difference, misses, lost committed steps, launches. None when no job was priced."""
    priced = [row for row in rows if row["cost"] is not None]
    if not priced:
        return None
    live = sum(row["cost"] for row in priced) / len(priced)
    sim = sum(row["sim_cost"] for row in priced) / len(priced)
    return {
        "jobs": len(rows),
        "live": live,
        "sim": sim,
        "diff": live / sim - 1,
        "missed": sum(1 for row in rows if not row["met"]),
        "sim_missed": sum(1 for row in rows if not row["sim_met"]),
        "lost": sum(1 for row in rows if row["lost_committed_step"]),
        "launches": sum(row["launches"] for row in rows),
        "sim_launches": sum(row["sim_launches"] for row in rows),
    }


def report(results: list[tuple[tuple[str, ...], int, dict[str, Any]]], seeds: list[int]) -> list[str]:
    """The lines after the table: with several seeds, each run's mean over its seeds and its spread, then
    each seed's totals; last, the totals of every job of every seed."""
    lines: list[str] = []
    if len(seeds) > 1:
        lines += [
            "",
            f"{'over the seeds':<40} {'seeds':>5} {'live $':>8} {'sim $':>8} {'diff':>7}  lowest..highest",
        ]
        for group in dict.fromkeys(g for g, _, _ in results):
            each = [t for g, _, r in results if g == group and (t := totals(r["rows"])) is not None]
            if not each:
                continue
            both = totals([row for g, _, r in results if g == group for row in r["rows"]])
            assert both is not None
            diffs = [t["diff"] * 100 for t in each]
            lines.append(
                f"{' + '.join(group):<40} {len(each):>5} {both['live']:>8.2f} {both['sim']:>8.2f} "
                f"{both['diff'] * 100:>+6.1f}%  {min(diffs):+.1f}%..{max(diffs):+.1f}%"
            )
        lines.append("")
        for seed in seeds:
            t = totals([row for _, s, r in results if s == seed for row in r["rows"]])
            if t is not None:
                lines.append(f"seed {seed}: {_said(t)}")
    t = totals([row for _, _, r in results for row in r["rows"]])
    if t is not None:
        lines.append(("\n" if len(seeds) == 1 else "") + f"all {t['jobs']} jobs: {_said(t)}")
    return lines


def _said(t: dict[str, Any]) -> str:
    return (
        f"live mean ${t['live']:.2f}, simulator ${t['sim']:.2f} ({t['diff'] * 100:+.1f}%); "
        f"missed {t['missed']} (simulator {t['sim_missed']}); lost committed steps {t['lost']}; "
        f"launches {t['launches']} (simulator {t['sim_launches']})"
    )


if __name__ == "__main__":
    sys.exit(main())
