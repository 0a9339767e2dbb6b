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
