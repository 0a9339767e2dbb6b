"""The small model and data the example training scripts share: everything a step needs is a function
of (seed, step), so a resumed run can match an uninterrupted one bit for bit."""

from __future__ import annotations

import os

import torch
from torch import nn

# Deterministic algorithms on a GPU need cuBLAS's fixed workspace, set before the first cuBLAS call
# (else the first matmul raises): the examples resume bit for bit on GPUs as on the CPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def init_distributed() -> torch.device:
    """torch.distributed for torchrun's ranks, and the device this rank trains on: its own GPU with nccl
    when the machine has a GPU for every local rank, else the CPU with gloo (no GPU, or more ranks than
    GPUs, as when a 2-rank job is rehearsed on a one-GPU machine)."""
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
    return torch.device("cpu")


def train_step(model: nn.Module, opt: torch.optim.Optimizer, seed: int, step: int) -> float:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(64, 16, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.item())
