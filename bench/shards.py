"""One rank of a job whose state is sharded across its ranks (DTensor, Shard(0), gloo on the CPU), for
tests/agent/test_restore_shares.py and the gang figure of `bench/checkpoint.py --restore`: `save`
commits the state through torch_state.save; `restore` loads it into a template of this job's size
through torch_state.restore and writes, as one JSON line in REPORT/<rank>.json, what this rank read and
whether every value came back.

    torchrun --nproc-per-node N shards.py save|restore --rows R [--report REPORT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from spotguard_agent import Agent
from spotguard_agent.torch_state import restore, save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

COLUMNS = 1024  # float32: 4 KiB a row


def state(rows: int, mesh: object, fill: bool) -> dict[str, object]:
    def tensor(seed: int) -> torch.Tensor:
        whole = torch.arange(rows * COLUMNS, dtype=torch.float32).reshape(rows, COLUMNS) + seed
        return whole if fill else torch.zeros_like(whole)

    return {
        "model": {"w": distribute_tensor(tensor(1), mesh, [Shard(0)])},
        "optimizer": {"m": distribute_tensor(tensor(2), mesh, [Shard(0)])},
        "step": 3,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["save", "restore"])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--report", type=Path, help="restore: where each rank writes its line (<rank>.json)")
    args = p.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    agent = Agent.from_env()
    if args.mode == "save":
        save(agent, 3, 0.5, state(args.rows, mesh, fill=True), sync=True)
        agent.close()
    else:
        got = restore(agent, into=state(args.rows, mesh, fill=False))
        want = state(args.rows, mesh, fill=True)
        same = got is not None and all(
            torch.equal(got[k][n].to_local(), want[k][n].to_local())  # type: ignore[index]
            for k, n in (("model", "w"), ("optimizer", "m"))
        )
        counts = agent.restore_counts
        line = {
            "rank": dist.get_rank(),
            "same": same and got["step"] == 3,  # type: ignore[index]
            "bytes": counts.bytes if counts else 0,
            "total": agent.restored.total_bytes if agent.restored else 0,
            "sequence": agent.restored.sequence if agent.restored else None,
        }
        (args.report / f"{dist.get_rank()}.json").write_text(json.dumps(line))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
