"""Benchmark of the agent's checkpoints against moto server S3 on 127.0.0.1.

1. Training-step stall: the wall time of a training step that checkpoints (async: the in-memory copy,
   the rest in the background; sync: copy, write and upload) against a step that does not.
2. Commit time of a 1 GiB checkpoint (4 files of 256 MiB) through the agent (transfer manager, parallel
   multipart, manifest last) against the same bytes sent as a single plain put_object.

Only ratios within one run mean anything on a shared machine; moto keeps objects in memory, so the
figures measure the client side (hashing, parallelism) more than a network.

    .venv/bin/python bench/checkpoint.py [--gib 1] [--state-mib 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import boto3
import torch
from spotguard_agent import Agent, AgentEnv, CheckpointStore
from spotguard_agent.torch_state import save
from torch import nn

from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS, MotoServer


def model_of(mib: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    width = 2048
    layers = max(1, mib * 1024 * 1024 // (4 * width * width * 2))  # weights + momentum
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    return model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.randn(32, 2048)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def stall(s3: object, bucket: str, state_mib: int, repeat: int) -> dict[str, float]:
    model, opt = model_of(state_mib)
    env = AgentEnv.model_validate({"SPOTGUARD_CHECKPOINT_URI": f"s3://{bucket}/stall/{uuid.uuid4().hex}/"})
    agent = Agent(env, CheckpointStore(s3, env.checkpoint_uri, keep=2), install_signals=False)
    for _ in range(3):
        step(model, opt)  # warm up
    out: dict[str, list[float]] = {"plain": [], "async": [], "sync": []}
    for _ in range(repeat):
        for kind in ("plain", "async", "sync"):
            agent.wait()
            t = time.perf_counter()
            step(model, opt)
            state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
            if kind != "plain":
                save(agent, 1, 0.5, state, sync=kind == "sync")
            out[kind].append(time.perf_counter() - t)
    agent.close()
    return {k: statistics.median(v) for k, v in out.items()}


def commit_vs_put(s3: object, bucket: str, gib: float) -> dict[str, float]:
    total = int(gib * 1024**3)
    files = 4
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d) / "ckpt"
        directory.mkdir()
        chunk = os.urandom(64 * 1024 * 1024)
        for i in range(files):
            with (directory / f"shard-{i}.bin").open("wb") as f:
                for _ in range(total // files // len(chunk)):
                    f.write(chunk)
        store = CheckpointStore(s3, f"s3://{bucket}/big/{uuid.uuid4().hex}/", keep=1)
        t = time.perf_counter()
        store.commit(directory, step=1, progress=0.5)
        agent_s = time.perf_counter() - t
        blob = b"".join((directory / f"shard-{i}.bin").read_bytes() for i in range(files))
        t = time.perf_counter()
        s3.put_object(Bucket=bucket, Key=f"plain/{uuid.uuid4().hex}", Body=blob)  # type: ignore[attr-defined]
        put_s = time.perf_counter() - t
    return {"bytes": float(total), "agent_commit_s": agent_s, "single_put_s": put_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--state-mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    os.environ.update(FAKE_CREDENTIALS)
    torch.manual_seed(0)
    with MotoServer() as moto:
        s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")
        bucket = "bench-checkpoints"
        s3.create_bucket(Bucket=bucket)
        st = stall(s3, bucket, args.state_mib, args.repeat)
        print(f"training step with a {args.state_mib} MiB state (median of {args.repeat}):")
        base = st["plain"]
        print(f"  no checkpoint   {base * 1000:8.1f} ms")
        for kind in ("async", "sync"):
            print(f"  {kind} save      {st[kind] * 1000:8.1f} ms   x{st[kind] / base:.2f} of a plain step")
        c = commit_vs_put(s3, bucket, args.gib)
        print(f"\ncommit of a {c['bytes'] / 1024**3:.2f} GiB checkpoint (4 files):")
        print(f"  agent commit (parallel multipart + sha256 + manifest)  {c['agent_commit_s']:6.2f} s")
        print(f"  one plain put_object of the same bytes                 {c['single_put_s']:6.2f} s")
        ratio = c["agent_commit_s"] / c["single_put_s"]
        print(f"  ratio agent / put_object                               {ratio:6.2f}")


if __name__ == "__main__":
    main()
