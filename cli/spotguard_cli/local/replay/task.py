"""The job a replay runs (`python -m spotguard_cli.local.replay.task`): `--work-hours` of work on the
replay's scaled clock, with the real agent committing its checkpoints to the stack's bucket.

Each attempt first pays the restart overhead (`--restart-hours` of the scaled clock from the moment the
process starts: what booting an instance, pulling the image and restoring cost on AWS, billed and with
no progress, as the simulator counts it), then works in steps of `--step-minutes`, committing a
checkpoint whenever the agent says so (its interval, SIGUSR1, SIGTERM). On SIGTERM it commits and exits
75; when the work is done it exits 0. Its log says what the replay checks: `resumed after step N`,
`committed step N`, `step N done`, `finished`.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports: the overhead is counted from the process's start

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402

from spotguard_agent import Agent  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spotguard_cli.local.replay.task", description=__doc__.split("\n\n")[0])
    p.add_argument("--work-hours", type=float, required=True)
    p.add_argument("--restart-hours", type=float, required=True)
    p.add_argument("--step-minutes", type=float, default=5.0)
    args = p.parse_args(argv)
    agent = Agent.from_env()
    env = agent.env
    scale = env.clock_scale
    started = _scaled(agent, STARTED)
    steps = max(1, round(args.work_hours * 60 / args.step_minutes))
    work = Path(tempfile.mkdtemp(prefix="spotguard-replay-"))
    state = {"next": 0}
    if agent.restore(work / "restored") is not None:
        state = json.loads((work / "restored" / "state.json").read_text())
        print(f"resumed after step {state['next'] - 1}", flush=True)

    def commit(step: int) -> None:
        ckpt = work / f"save-{step}"
        ckpt.mkdir(exist_ok=True)
        (ckpt / "state.json").write_text(json.dumps(state))
        agent.commit(ckpt, step, state["next"] / steps)
        print(f"committed step {step}", flush=True)

    # the restart overhead: no progress until `restart-hours` after the process started
    ready = started.timestamp() + args.restart_hours * 3600
    while agent.env.clock().timestamp() < ready and not agent.stopping:
        time.sleep(min(0.05, max(0.0, (ready - agent.env.clock().timestamp()) / scale)))
    if agent.stopping:  # nothing done since the checkpoint it restored (if any): that one stands
        print(f"stopped during the restart overhead: exit {agent.exit_code}", flush=True)
        return agent.exit_code
    step_wall = args.step_minutes * 60 / scale
    next_at = time.monotonic() + step_wall
    for step in range(state["next"], steps):
        while (left := next_at - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))
        next_at += step_wall
        state["next"] = step + 1
        print(f"step {step} done", flush=True)
        if agent.should_save():
            commit(step)
        if agent.should_exit():
            print(f"checkpointed after step {step}: exit {agent.exit_code}", flush=True)
            return agent.exit_code
    agent.close()
    print("finished", flush=True)
    return 0


def _scaled(agent: Agent, wall: float) -> datetime:
    """The scaled clock's reading at the wall clock's `wall` (Unix seconds)."""
    now_wall = time.time()
    ahead = (now_wall - wall) * agent.env.clock_scale
    return datetime.fromtimestamp(agent.env.clock().timestamp() - ahead, UTC)


if __name__ == "__main__":
    sys.exit(main())
