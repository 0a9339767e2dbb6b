"""A small PyTorch training job that survives spot interruptions with the SpotGuard agent.

Everything a step needs is a function of (seed, step) or is in the checkpoint (model, optimizer with its
momentum, RNG state), so a run that is stopped, checkpointed and resumed ends with exactly the weights
of a run that never stopped. On SIGTERM it checkpoints at the end of the current step and exits 75
(SpotGuard resubmits it with SPOTGUARD_RESUME_FROM); on SIGUSR1 it checkpoints and goes on.

    SPOTGUARD_CHECKPOINT_URI=s3://bucket/jobs/demo/ python examples/train.py --steps 200 --out final.pt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from spotguard_agent import Agent
from spotguard_agent.torch_state import restore, save
from tinymodel import build, train_step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="where the final weights go")
    p.add_argument("--step-seconds", type=float, default=0.0, help="pause per step (to watch it)")
    p.add_argument("--sync", action="store_true", help="save synchronously (small states)")
    args = p.parse_args()

    model, opt = build(args.seed)

    agent = Agent.from_env()
    first = 0
    state = restore(agent)  # straight from the store into memory: no copy on a disk
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        first = state["step"] + 1
        print(f"resumed after step {state['step']}", flush=True)

    for step in range(first, args.steps):
        loss = train_step(model, opt, args.seed, step)
        print(f"step {step} loss {loss:.6f}", flush=True)
        if agent.should_save():
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state()}
            save(agent, step, (step + 1) / args.steps, {**state, "step": step}, sync=args.sync)
        if agent.should_exit():
            print(f"checkpointed after step {step}: exit {agent.exit_code}", flush=True)
            return agent.exit_code
        time.sleep(args.step_seconds)
    agent.close()
    torch.save(model.state_dict(), args.out)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
