"""What the `spotguard local` commands share: where their state and logs go, the files `up` and `inject`
talk through, and the demos' training job, its uninterrupted twin, the checks on both and their report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spotguard_cli.answers import StatusView, read_status
from spotguard_cli.emulator.template import REPO
from spotguard_cli.emulator.timeline import Timeline

STATE_DIR = Path(".local-stack")
STATE_FILE = STATE_DIR / "up.json"  # written by a running `up`, read by `inject`
SHORTAGE = "capacity-shortage"
SHORTAGES = STATE_DIR / "shortages"  # `inject capacity-shortage` asks the running `up` through files here
TRAIN = REPO / "examples" / "train.py"
PLACEHOLDER_PRICES = "moto's placeholder prices"


# ==================================================================================== the demos' job
def add_spot_hosts(system: Any, kind: str, per_zone: int) -> tuple[list[Any], str]:
    """`per_zone` spot instances of `kind` in each of the local stack's two zones (us-east-1a, then
    us-east-1b), and their names in words: 'i-... (1a), i-... (1b)'."""
    hosts = [system.add_host(kind, zone) for zone in ("us-east-1a", "us-east-1b") for _ in range(per_zone)]
    return hosts, ", ".join(f"{h.instance_id} ({h.availability_zone[-2:]})" for h in hosts)


def train_args(steps: int, out: Path, step_seconds: float | None = None) -> list[str]:
    """The demos' training arguments (examples/train.py and train_ddp.py take the same): `steps` steps,
    the final weights written to `out`, and with `step_seconds` a pause after each step."""
    args = ["--steps", str(steps), "--out", str(out)]
    return args if step_seconds is None else [*args, "--step-seconds", str(step_seconds)]


def task_definition(
    system: Any, out: Path, steps: int, step_seconds: float, checkpoint_seconds: float = 2
) -> str:
    """The demos' task definition: examples/train.py with the agent, its final weights written to `out`."""
    return str(
        system.task_definition(
            [sys.executable, str(TRAIN), *train_args(steps, out, step_seconds)],
            gpus=1,
            environment={"SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS": f"{checkpoint_seconds:g}"},
            family="train",
        )
    )


# what the agent's library says at the end of the first step after a restore (issue 47)
FIRST_STEP = re.compile(
    r"first step after the restore: (?P<first>[\d.]+) s from the process's start "
    r"\(restore (?P<restore>[\d.]+) s\)"
)


def first_step(log_text: str) -> tuple[float, float] | None:
    """(container start -> first training step, the restore's share of it) in seconds, as the agent
    said it in an attempt's log; None when it did not (a first attempt, or no agent library)."""
    found = FIRST_STEP.search(log_text)
    return (float(found["first"]), float(found["restore"])) if found else None


def first_step_line(attempt: int, seconds: tuple[float, float]) -> str:
    return (
        f"attempt {attempt}: container start -> first training step {seconds[0]:.2f} s, of which the "
        f"restore {seconds[1]:.2f} s"
    )


def steps_done(log: Path) -> list[int]:
    """The training steps a task's log says were done, in order."""
    if not log.exists():
        return []
    return [int(m.group(1)) for m in re.finditer(r"^step (\d+) loss", log.read_text(), re.MULTILINE)]


def reference_run(system: Any, out: Path, steps: int, log: Path) -> subprocess.Popen[bytes]:
    """The same training, never interrupted, with a checkpoint prefix of its own."""
    from spotguard_cli.emulator.runner import local_environment

    env = {
        **local_environment(system.stack.endpoint, system.stack.region),
        "SPOTGUARD_CHECKPOINT_URI": f"s3://{system.stack.outputs['CheckpointBucketName']}/reference/",
        "SPOTGUARD_JOB_ID": "reference",
    }
    return subprocess.Popen(
        [sys.executable, str(TRAIN), *train_args(steps, out)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


# ================================================================================== the demos' proof
def picture(status: StatusView | Mapping[str, Any], work: Path, facts: dict[str, Any]) -> bool:
    """Draw the job's timeline (as `spotguard jobs status --plot` does) to work/timeline.png; True when
    the picture has one bar per attempt. Its dollars are moto's placeholder prices, and it says so."""
    from spotguard_cli.timeline_plot import plot_job

    job = read_status(status)
    path = work / "timeline.png"
    drawn = plot_job(job, str(path), prices_note=PLACEHOLDER_PRICES)
    facts["timeline_png"] = str(path)
    return path.exists() and len(drawn.bars) == len(job.attempts)


def same_weights(a: Path, b: Path) -> bool:
    """Whether two saved state dicts hold the same tensors."""
    import torch

    wa, wb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def passed(proof: list[tuple[str, bool]]) -> bool:
    """Whether a demo passed: it has a proof, and every check of it holds."""
    return bool(proof) and all(p for _, p in proof)


def print_json(
    ok: bool, timeline: Timeline, proof: list[tuple[str, bool]], facts: dict[str, Any], **more: Any
) -> None:
    """A demo's --json answer, one object: whether it passed, its timeline, `more` of its own (after the
    timeline), its checks and its facts."""
    print(
        json.dumps(
            {
                "ok": ok,
                "timeline": [{"seconds": round(t, 3), "what": w} for t, w in timeline.rows],
                **more,
                "proof": [{"check": c, "passed": p} for c, p in proof],
                "facts": facts,
            }
        )
    )


def print_timeline(timeline: Timeline, seconds: str) -> None:
    """A demo's timeline, a line for each row: its seconds (what they count: `seconds`), what happened."""
    print(f"\ntimeline ({seconds}):")
    for t, what in timeline.rows:
        print(f"  {t:+8.3f}s  {what}")


def print_proof(proof: list[tuple[str, bool]]) -> None:
    """A demo's checks, each ok or FAILED."""
    print("\nproof:")
    for c, ok in proof:
        print(f"  [{'ok' if ok else 'FAILED'}] {c}")


def print_end(work: Path, ok: bool) -> None:
    """A demo's last lines: where its logs are, that nothing is left running, and whether it passed."""
    print(f"logs: {work}/ (functions.log, task-*.log, reference.log, moto.log, timeline.png)")
    print("moto server and every task process stopped.\n" + ("demo passed" if ok else "demo FAILED"))


def same_hash_seed() -> None:
    """Run this command again with string hashing fixed (PYTHONHASHSEED=0), unless it already is: a run on
    the virtual clock repeats exactly only if every set of strings iterates in the same order."""
    import os

    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, "PYTHONHASHSEED": "0"})


def quiet_moto() -> None:
    """moto in this process says what its CloudFormation does not model (alarms, queue policies): nothing
    a run on the virtual clock reads. Keep it off the user's terminal."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("moto").setLevel(logging.ERROR)
