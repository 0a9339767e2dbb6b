"""`virtual_system`: the whole stack in this process on a virtual clock, for a soak (loop.py) or a replay
(local/replay/virtual.py): every function over moto, each invocation taking its modelled time, every date
and draw from the clock and the seed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO
from unittest import mock

if TYPE_CHECKING:
    from spotguard_cli.emulator.latency import ColdStarts
    from spotguard_cli.emulator.vclock import VirtualClock
    from spotguard_cli.emulator.world import JobsWorld

RETRY_BASE_SECONDS = 30  # the stack's first wait for capacity


@contextlib.contextmanager
def virtual_system(
    clock: VirtualClock, seed: int, log: TextIO | None
) -> Iterator[tuple[JobsWorld, Callable[[], list[Any]], ColdStarts]]:
    """The whole stack in this process on `clock`, for a soak or a replay: every function over moto
    (`_moto`), no host yet; every date and draw from the clock and the seed (vclock.installed); the
    functions without their threads (vclock.one_thread: which thread called first would change the
    run); each invocation taking its modelled time, cold starts counted (latency.timed_invocations);
    moto's DynamoDB scans and its dispatch quicker, with the same answers (motopatch). Yields the world,
    the role guards installed meanwhile (their `denied` calls), and the cold starts."""
    from spotguard_cli.emulator.latency import timed_invocations
    from spotguard_cli.emulator.motopatch import quicker_dispatch, quicker_dynamodb_scans
    from spotguard_cli.emulator.vclock import installed, one_thread
    from spotguard_cli.emulator.world import make_jobs_world

    # moto's EC2 loads its public AMIs (ids drawn from the seeded random) unless told not to: left to the
    # caller's environment, the same seed gave another run under pytest (which turns them off) than in a
    # shell. No run reads them; always off.
    amis_off = mock.patch.dict(os.environ, {"MOTO_EC2_LOAD_DEFAULT_AMIS": "false"})
    with amis_off, installed(clock, seed), _moto() as denied, quicker_dynamodb_scans(), one_thread():
        env = {"SPOTGUARD_RETRY_BASE_SECONDS": str(RETRY_BASE_SECONDS)}
        world = make_jobs_world(env=env, log=log, hosts=False, caught=False)
        with quicker_dispatch():  # once the stack's deployment has imported moto's services
            yield world, denied, timed_invocations(world.functions, clock, seed)


@contextlib.contextmanager
def _moto() -> Iterator[Callable[[], list[Any]]]:
    """moto in this process, ECS tasks held where they are (a task runs until it stops), every function
    held to its role's actions (emulator/iam.py); yields the role guards installed meanwhile."""
    from moto import mock_aws
    from moto.moto_api import state_manager

    from spotguard.adapters import clients
    from spotguard_cli.emulator import iam

    guards = len(iam.INSTALLED)
    with mock_aws():
        state_manager.set_transition(
            model_name="ecs::task", transition={"progression": "manual", "times": 10**9}
        )
        try:
            yield lambda: list(iam.INSTALLED[guards:])
        finally:
            state_manager.unset_transition("ecs::task")
            clients.reset()
            del iam.INSTALLED[guards:]
