"""A training script that knows nothing of SpotGuard: it keeps its own checkpoint in --ckpt-dir (every
--save-every steps, and at the end of the step when SIGTERM comes) and resumes from it if it is there.
Run it under the wrapper and SpotGuard makes those checkpoints survive the instance:

    spotguard-agent run --dir /ckpt -- python examples/train_plain.py --ckpt-dir /ckpt --out final.pt
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
from tinymodel import build, train_step

stop = False


def on_sigterm(signum: int, frame: object) -> None:
    global stop
    stop = True


def save(ckpt: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    tmp = ckpt / "state.pt.tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, ckpt / "state.pt")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--save-every", type=int, default=25)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--step-seconds", type=float, default=0.0)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)

    model, opt = build(args.seed)
    first = 0
    if (args.ckpt_dir / "state.pt").exists():
        state = torch.load(args.ckpt_dir / "state.pt", weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        first = state["step"] + 1
        print(f"resumed after step {state['step']}", flush=True)
    for step in range(first, args.steps):
        loss = train_step(model, opt, args.seed, step)
        print(f"step {step} loss {loss:.6f}", flush=True)
        if stop or (step + 1) % args.save_every == 0:
            save(args.ckpt_dir, model, opt, step)
        if stop:
            print(f"saved after step {step}, stopping", flush=True)
            return 143
        time.sleep(args.step_seconds)
    torch.save(model.state_dict(), args.out)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
