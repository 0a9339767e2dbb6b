"""A data-parallel (DDP) PyTorch training job of several processes, run by torchrun, that survives spot
interruptions with the SpotGuard agent: every rank uses the agent's API as a single process does, and
the agent makes one checkpoint of them all (one decision per step, one manifest).

Each step's global batch is a function of (seed, step), split among the ranks, so a run stopped,
checkpointed and resumed on the same number of ranks ends with exactly the weights of one never
stopped; it can also resume on another number of ranks (the model is replicated, the checkpoint holds
it once). nccl with a GPU a rank, else gloo on the CPU (tinymodel.init_distributed).

    spotguard-agent run -- torchrun --nproc-per-node 4 examples/train_ddp.py --steps 1000 --out final.pt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from spotguard_agent import Agent
from spotguard_agent.torch_state import restore, save
from tinymodel import build, init_distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def batch(seed: int, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(64, 16, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x[rank::world], y[rank::world]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="where rank 0 writes the final weights")
    p.add_argument("--step-seconds", type=float, default=0.0, help="pause per step (to watch it)")
    p.add_argument("--save-every", type=int, default=0, help="also checkpoint every N steps")
    args = p.parse_args()

    device = init_distributed()  # a GPU a rank with nccl, else the CPU with gloo
    rank, world = dist.get_rank(), dist.get_world_size()
    model, _ = build(args.seed)
    model = model.to(device)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    agent = Agent.from_env()  # every rank
    first = 0
    state = restore(agent)  # the same checkpoint in every rank, straight from the store
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        first = state["step"] + 1
        if rank == 0:
            print(f"resumed after step {state['step']} on {world} rank(s)", flush=True)

    for step in range(first, args.steps):
        x, y = batch(args.seed, step, rank, world)
        loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        due = agent.should_save()  # every rank, every step: one decision for all
        if due or (args.save_every and (step + 1) % args.save_every == 0 and not agent.stop_agreed):
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
            save(agent, step, (step + 1) / args.steps, state)
        if agent.should_exit():
            if rank == 0:
                print(f"checkpointed after step {step}: exit {agent.exit_code}", flush=True)
            dist.destroy_process_group()
            return agent.exit_code
        time.sleep(args.step_seconds)
    agent.close()
    if rank == 0:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, args.out)
        print("finished", flush=True)
    dist.barrier()  # every rank done before any tears its groups down (gloo aborts at exit otherwise)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
