"""GPU instance types SpotGuard knows: GPUs per instance and the on-demand list price. Pure data.

Prices are US East (N. Virginia) Linux on-demand list prices in USD per hour (AWS price list, 2025);
they make the money figures of `status` an estimate, not a bill. Spot prices are read from EC2's spot
price history when an attempt starts; GPU counts of types missing here come from DescribeInstanceTypes.
"""

from __future__ import annotations

# instance type: (GPUs, on-demand USD per hour)
GPU_INSTANCES: dict[str, tuple[int, float]] = {
    "g4dn.xlarge": (1, 0.526),
    "g4dn.2xlarge": (1, 0.752),
    "g4dn.4xlarge": (1, 1.204),
    "g4dn.8xlarge": (1, 2.176),
    "g4dn.12xlarge": (4, 3.912),
    "g4dn.16xlarge": (1, 4.352),
    "g4dn.metal": (8, 7.824),
    "g5.xlarge": (1, 1.006),
    "g5.2xlarge": (1, 1.212),
    "g5.4xlarge": (1, 1.624),
    "g5.8xlarge": (1, 2.448),
    "g5.12xlarge": (4, 5.672),
    "g5.16xlarge": (1, 4.096),
    "g5.24xlarge": (4, 8.144),
    "g5.48xlarge": (8, 16.288),
    "g6.xlarge": (1, 0.805),
    "g6.2xlarge": (1, 0.978),
    "g6.4xlarge": (1, 1.323),
    "g6.8xlarge": (1, 2.014),
    "g6.12xlarge": (4, 4.602),
    "g6.16xlarge": (1, 3.397),
    "g6.24xlarge": (4, 6.675),
    "g6.48xlarge": (8, 13.35),
    "p3.2xlarge": (1, 3.06),
    "p3.8xlarge": (4, 12.24),
    "p3.16xlarge": (8, 24.48),
    "p4d.24xlarge": (8, 21.9576),
    "p5.48xlarge": (8, 55.04),
}


# USD per instance-hour, Linux, shared tenancy, US East (N. Virginia). Source: the AWS EC2 On-Demand
# pricing page (aws.amazon.com/ec2/pricing/on-demand), read in 2025, after the June 2025 reductions of
# P4/P5. The GPU types above (GPU_INSTANCES), the g6e family and the CPU types of the examples: pool
# discovery prices a pool's type from this one table. Other regions cost
# more or less: tag the capacity provider `spotguard:on-demand-price` there (see `price_override`).
ON_DEMAND_PRICES: dict[str, float] = {
    **{itype: price for itype, (_gpus, price) in GPU_INSTANCES.items()},
    "g6e.xlarge": 1.861,
    "g6e.2xlarge": 2.242,
    "g6e.4xlarge": 3.004,
    "g6e.8xlarge": 4.529,
    "g6e.12xlarge": 10.493,
    "g6e.16xlarge": 7.577,
    "g6e.24xlarge": 15.066,
    "g6e.48xlarge": 30.131,
    # CPU types of examples/gpu-cluster (the non-GPU services' group) and common small ones.
    "m7i.large": 0.1008,
    "m6i.large": 0.096,
    "m6a.large": 0.0864,
    "m5.large": 0.096,
    "c6i.xlarge": 0.17,
    "c5.xlarge": 0.17,
    "t3.medium": 0.0416,
}

# A pool whose on-demand price is unknown (a type missing above, no tag) is not given a guessed price: its
# record says None. The policy needs a number, so `pool_options` gives it this penalty instead: twice the
# dearest known price per GPU (p5.48xlarge), per GPU of the pool (per instance for a CPU pool). It is a
# penalty, not an estimate: the pool is then costlier on-demand than any priced one, so on-demand goes to
# a priced pool whenever one fits; spot in it is still used (its spot price is real).
UNPRICED_PER_GPU = 2 * max(price / gpus for gpus, price in GPU_INSTANCES.values())


def on_demand_price(instance_type: str) -> float | None:
    known = GPU_INSTANCES.get(instance_type)
    return known[1] if known else None


def gpus_of(instance_type: str) -> int | None:
    known = GPU_INSTANCES.get(instance_type)
    return known[0] if known else None


def task_share(instance_price: float, task_gpus: int, instance_gpus: int | None) -> float:
    """The part of an instance's price a task pays: its share of the GPUs (all of it when unknown)."""
    if task_gpus <= 0 or not instance_gpus or task_gpus >= instance_gpus:
        return instance_price
    return instance_price * task_gpus / instance_gpus


# The prices the "Can't Be Late" paper (NSDI 2024) measured for p3.2xlarge (1 V100) and used with the
# spot traces in ../shared/traces: spot, on demand, USD per hour. The demo and the simulator use them
# where moto's placeholder spot prices would say nothing.
PAPER_SPOT_PRICE = 0.9731
PAPER_ON_DEMAND_PRICE = 3.06
