"""An invocation cut half-way (timed out or crashed, emulator/faults.py's InvocationCut) on the virtual
clock of the soak (emulator/vclock.py): what its calls did stands, and Powertools' idempotency record it
left IN_PROGRESS expires on the virtual clock, so that the same request again is refused only until then
and then answered, with the one job the cut submit made."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from spotguard_cli.emulator.faults import CUT, Fault, Injector
from spotguard_cli.emulator.lambdas import InvocationFailed, LambdaContext
from spotguard_cli.emulator.vclock import VirtualClock, installed
from spotguard_cli.emulator.world import make_jobs_world
from tests.integration.conftest import fresh_aws

pytestmark = pytest.mark.slow  # it deploys the stack into moto


def test_a_submit_cut_half_way_is_refused_until_its_record_expires_then_answered_with_its_one_job():
    clock = VirtualClock(datetime(2030, 1, 7, tzinfo=UTC))
    with installed(clock, 1), fresh_aws():
        world = make_jobs_world()
        injector = Injector(world.stack.client, {})
        injector.install()
        td = world.cluster.gpu_task_definition(gpus=1)
        payload = {
            "action": "submit",
            "job_id": "cut-submit",
            "request": {"cluster": "gpu-spot", "taskDefinition": td, "launchType": "EC2"},
        }
        injector.reset(Fault("RunTask", 1, CUT))  # the job is written, its launch never happens
        with pytest.raises(InvocationFailed, match="cut at RunTask#1"):
            world.invoke(payload)
        injector.reset(None)

        early = world.invoke(payload)  # the idempotency record is still IN_PROGRESS
        assert early["ok"] is False and early["error"]["type"] == "InternalError", early
        timeout = LambdaContext(world.jobs_fn.fn, world.stack.region).get_remaining_time_in_millis() / 1000
        clock.advance(timeout + 1)  # the cut invocation's time is up, on the virtual clock
        answer = world.invoke(payload)
        assert answer["ok"] is True and answer["job"]["job_id"] == "cut-submit", answer
        assert [j["job_id"] for j in world.invoke({"action": "list"})["jobs"]] == ["cut-submit"]
        assert world.scheduler.requests == []  # the cut launch was never made; reconcile's to do
