"""The one place the local system is put together: the stack deployed into moto, the GPU cluster with ECS
placement played by `GpuScheduler`, every function's handler in this process, and a poller per queue.

`LocalSystem` (system.py: moto server, tasks as local processes) and `JobsWorld` (world.py: moto in this
process, task events played by the tests) are both built on `assemble`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

from spotguard.adapters import clients
from spotguard_cli.emulator.gpucluster import GpuCluster
from spotguard_cli.emulator.gpuscheduler import GpuScheduler
from spotguard_cli.emulator.iam import RoleGuard
from spotguard_cli.emulator.lambdas import FunctionHost, QueuePoller
from spotguard_cli.emulator.motoserver import hold_ecs_tasks
from spotguard_cli.emulator.stack import DeployedStack, deploy

CLUSTER = "gpu-spot"


@dataclass
class Assembly:
    """What `assemble` built; nothing in it runs until something polls its queues or invokes it."""

    stack: DeployedStack
    cluster: GpuCluster
    scheduler: GpuScheduler
    functions: dict[str, FunctionHost]  # logical id -> the handler, in the template's order
    pollers: list[QueuePoller]  # one per SQS event source mapping, in the template's order
    guard: RoleGuard  # the functions' roles, and every call they made that their role does not allow

    def poller(self, function: str, queue: str = "") -> QueuePoller:
        """The poller that feeds `function` from its queue whose ARN contains `queue` (default: its first)."""
        return next(p for p in self.pollers if p.host.fn.logical_id == function and queue in p.queue_arn)


def assemble(
    endpoint: str | None,
    parameters: dict[str, str] | None = None,
    environment: dict[str, str] | None = None,
    log: TextIO | None = None,
) -> Assembly:
    """Deploy the template into moto at `endpoint` (None: moto in this process, under `mock_aws`) with
    `parameters` beside ClusterNames, give every function `environment` on top of the stack's, install the
    GPU scheduler's hooks on SpotGuard's clients, and import every function's handler (logging to `log`).
    The GPU cluster starts with no host: the caller adds them."""
    if endpoint is not None:
        hold_ecs_tasks(endpoint)  # under mock_aws the caller sets moto's state manager itself
    stack = deploy(endpoint, {"ClusterNames": CLUSTER, **(parameters or {})})
    for fn in stack.functions.values():
        fn.environment.update(environment or {})
    cluster = GpuCluster(stack.client("ecs"), stack.client("ec2"), CLUSTER)
    clients.reset()  # SpotGuard's clients and hooks from an earlier system in this process
    guard = RoleGuard.installed_for(stack)  # each function held to its role, as AWS would and moto does not
    scheduler = GpuScheduler(cluster)
    scheduler.install()
    functions = {name: FunctionHost(stack, fn, log=log) for name, fn in stack.functions.items()}
    pollers = [
        QueuePoller(stack, host, queue_arn) for host in functions.values() for queue_arn in host.fn.queues
    ]
    return Assembly(
        stack=stack, cluster=cluster, scheduler=scheduler, functions=functions, pollers=pollers, guard=guard
    )
