"""The small model and data the example training scripts share: everything a step needs is a function
of (seed, step), so a resumed run can match an uninterrupted one bit for bit."""

from __future__ import annotations

import torch
from torch import nn


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, seed: int, step: int) -> float:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(64, 16, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.item())
