"""SpotGuard's recorded behaviour, for changes that must not change it (a reshape, a rename, a split):
300 seeded capacity decisions (`choose_capacity`), 20 simulated runs of the spotguard policy, the local
soak's full result for two seeds (one with faults) and the local replay's for one seed, written as one
JSON document whose every line can be compared. Record before a change, record after, compare:

    .venv/bin/python bench/behaviour.py --out .behaviour/before.json
    ...the change...
    .venv/bin/python bench/behaviour.py --out .behaviour/after.json --against .behaviour/before.json

`--against` exits 1 and names the first section that differs. The soaks and the replay run the CLI as a
user does (each in a fresh process, on the virtual clock: the same seed gives the same run); their
timeline and function logs are recorded as SHA-256 digests, their results whole. The traces are the
made ones of the replay's tests (tests/e2e/replay_traces.py), so nothing outside the repository is read.
About six minutes on two cores (`make behaviour`)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import decide  # noqa: E402  (the benchmark's draw of random jobs and pools, the same cases)

from tests.e2e.replay_traces import write_traces  # noqa: E402

DECISIONS = 300
SIMULATED = 20
SOAKS = ({"seed": 5, "faults": "0", "call_faults": None}, {"seed": 7, "faults": "0.3", "call_faults": "0.05"})
REPLAY_SEED = 3


def decisions(seed: int = 46) -> list[Any]:
    """`choose_capacity` for DECISIONS random jobs on four pools each, every field of each answer."""
    try:
        from spotguard.domain.capacity import planner
    except ImportError:  # a tree from before issue 46, where the planner sat at the domain's root
        from spotguard.domain import planner  # type: ignore[no-redef]

    rng = random.Random(seed)
    answers = []
    for _ in range(DECISIONS):
        job, pools = decide.build(planner, decide.draw(rng))
        answer = planner.choose_capacity(job, pools, decide.TICK).model_dump(mode="json")
        answer.pop("at")  # when it was made: the wall clock
        answers.append(answer)
    return answers


def _spotguard(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "PYTHONHASHSEED"}
    command = [sys.executable, "-m", "spotguard_cli.main", *argv]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"spotguard {' '.join(argv)} failed: {done.stderr[-2000:]}")
    return done


def simulated(traces: tuple[Path, Path], cwd: Path) -> list[Any]:
    """SIMULATED runs: each trace a pool of its own (5 starts each), then both at once (10 starts)."""
    common = ["--policy", "spotguard", "--job-hours", "6", "--deadline-hours", "9", "--restart-hours", "0.2"]
    common += ["--trace", str(traces[0]), "--trace", str(traces[1]), "--json"]
    alone = _spotguard("simulate", *common, "--samples", str(SIMULATED // 4), "--seed", "11", cwd=cwd)
    both = _spotguard("simulate", *common, "--multi-pool", "--samples", str(SIMULATED // 2), "--seed", "12",
                      cwd=cwd)  # fmt: skip
    runs = [json.loads(alone.stdout), json.loads(both.stdout)]
    for run in runs:
        run.pop("seconds", None)  # the wall clock's
    return runs


# Where in the code a log line was written (a function and its line, a traceback's files): a reshape moves
# code, not behaviour, so these are left out of the functions' log before its digest; the rest of each line
# (its message, level, ids, fields, the exception's name, every EMF metric) is kept.
CODE_POSITIONS = ("location", "exception", "stack_trace")


def _digest(path: Path) -> str:
    if path.name != "functions.log":
        return hashlib.sha256(path.read_bytes()).hexdigest()
    lines = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        lines.append(json.dumps({k: v for k, v in record.items() if k not in CODE_POSITIONS}, sort_keys=True))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def soak(traces: tuple[Path, Path], cwd: Path, seed: int, faults: str, call_faults: str | None) -> Any:
    argv = ["local", "soak", "--trace", str(traces[0]), "--trace", str(traces[1]), "--jobs", "8"]
    argv += ["--job-hours", "3", "--hours", "12", "--seed", str(seed), "--json", "--faults", faults]
    argv += [] if call_faults is None else ["--call-faults", call_faults]
    result = json.loads(_spotguard(*argv, cwd=cwd).stdout)
    result.get("facts", {}).pop("wall_seconds", None)
    logs = cwd / ".local-stack" / "soak"
    logged = {name: _digest(logs / f"{name}.log") for name in ("timeline", "functions")}
    return {"result": result, **logged}


def replay(traces: tuple[Path, Path], cwd: Path) -> Any:
    argv = ["local", "replay", "--trace", str(traces[0]), "--trace", str(traces[1]), "--jobs", "2"]
    argv += ["--job-hours", "6", "--deadline-hours", "9", "--restart-hours", "0.2"]
    argv += ["--seed", str(REPLAY_SEED), "--json"]
    result = json.loads(_spotguard(*argv, cwd=cwd).stdout)
    result.get("facts", {}).pop("wall_seconds", None)
    return result


def record() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        cwd = Path(folder)
        traces = write_traces(cwd)
        out: dict[str, Any] = {"decisions": decisions(), "simulated": simulated(traces, cwd)}
        for s in SOAKS:
            out[f"soak-seed-{s['seed']}"] = soak(traces, cwd, s["seed"], s["faults"], s["call_faults"])
        out[f"replay-seed-{REPLAY_SEED}"] = replay(traces, cwd)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where the record is written (JSON)")
    parser.add_argument("--against", type=Path, help="an earlier record: exit 1 where this one differs")
    args = parser.parse_args()
    now = record()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    for name, value in now.items():
        print(f"{name:<16} {hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]}")
    if args.against is None:
        return 0
    before = json.loads(args.against.read_text())
    differ = [k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    if differ:
        print(f"differs from {args.against}: {', '.join(differ)}")
        return 1
    print(f"identical to {args.against}, byte for byte ({args.out.stat().st_size} bytes)")
    return 0 if args.out.read_bytes() == args.against.read_bytes() else 1


if __name__ == "__main__":
    raise SystemExit(main())
