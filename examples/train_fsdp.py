"""A sharded (FSDP2, `fully_shard`) PyTorch training job of several processes, run by torchrun, that
survives spot interruptions with the SpotGuard agent. Each rank holds a shard of the model and of the
optimizer's state (DTensors); each writes its own shards into the one checkpoint, and on restore each
reads its part, also when the job resumes on another number of ranks (8 GPUs to 4: DCP reshards).

    spotguard-agent run -- torchrun --nproc-per-node 8 examples/train_fsdp.py --steps 1000 --out final.pt

nccl with a GPU a rank, else gloo on the CPU (tinymodel.init_distributed).
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
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard
from train_ddp import batch


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
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    agent = Agent.from_env()
    first = 0
    model_sd, optim_sd = get_state_dict(model, opt)  # this rank's shards: what to load in place
    # straight from the store: each rank reads only its shards (resharded when the world size changed)
    state = restore(agent, into={"model": model_sd, "optimizer": optim_sd})
    if state is not None:
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        first = state["step"] + 1
        if rank == 0:
            print(f"resumed after step {state['step']} on {world} rank(s)", flush=True)

    for step in range(first, args.steps):
        x, y = batch(args.seed, step, rank, world)
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        due = agent.should_save()
        if due or (args.save_every and (step + 1) % args.save_every == 0 and not agent.stop_agreed):
            model_sd, optim_sd = get_state_dict(model, opt)  # DTensor shards, keyed by parameter name
            save(
                agent, step, (step + 1) / args.steps, {"model": model_sd, "optimizer": optim_sd, "step": step}
            )
        if agent.should_exit():
            if rank == 0:
                print(f"checkpointed after step {step}: exit {agent.exit_code}", flush=True)
            dist.destroy_process_group()
            return agent.exit_code
        time.sleep(args.step_seconds)
    agent.close()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, args.out)
        print("finished", flush=True)
    dist.barrier()  # every rank done before any tears its groups down (gloo aborts at exit otherwise)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
