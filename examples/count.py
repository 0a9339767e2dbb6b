"""The smallest job that survives interruptions with the SpotGuard agent, without PyTorch: it counts
to --steps, one step per --step-seconds, keeping its state in a JSON file that the agent commits.

On SIGTERM it commits at the end of the current step and exits 75 (SpotGuard resubmits it with
SPOTGUARD_RESUME_FROM); on SIGUSR1 it commits and goes on. At the end it writes the steps it ran, per
attempt, to --out. The local stack's tests run it; it is also the agent's API in thirty lines.

    SPOTGUARD_CHECKPOINT_URI=s3://bucket/jobs/count/ python examples/count.py --steps 100 --out done.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from spotguard_agent import Agent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    agent = Agent.from_env()
    work = Path(tempfile.mkdtemp(prefix="spotguard-count-"))
    state = {"next": 0, "ran": {}}  # ran: attempt -> steps run in it
    if agent.restore(work / "restored") is not None:
        state = json.loads((work / "restored" / "state.json").read_text())
        print(f"resumed after step {state['next'] - 1}", flush=True)
    attempt = str(agent.env.attempt)
    for step in range(state["next"], args.steps):
        time.sleep(args.step_seconds)
        state["next"] = step + 1
        state["ran"][attempt] = state["ran"].get(attempt, 0) + 1
        print(f"step {step} done", flush=True)
        if agent.should_save():
            ckpt = work / f"save-{step}"
            ckpt.mkdir()
            (ckpt / "state.json").write_text(json.dumps(state))
            agent.commit(ckpt, step, (step + 1) / args.steps)
        if agent.should_exit():
            print(f"checkpointed after step {step}: exit {agent.exit_code}", flush=True)
            return agent.exit_code
    agent.close()
    args.out.write_text(json.dumps(state))
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
