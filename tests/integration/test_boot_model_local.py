"""The boot model in the local stack (LocalSystem(boot_seconds=...)) on moto server: moto server's local
ECS operations (a task PROVISIONING, then placed), the groups' instances joining after their boot with the
bus told, the agent starting a task only once it is placed, a reclaimed instance replaced by its group;
and the stack without the boot model as before."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotguard.adapters import clients
from spotguard_cli.emulator.gpucluster import PoolGroup
from spotguard_cli.emulator.motoserver import MotoServer
from spotguard_cli.emulator.system import LocalSystem

pytestmark = pytest.mark.slow
POOLS = [
    PoolGroup("gpu-spot-a", "gpu-spot-a-group", "g5.xlarge", ("us-east-1a",), spot=True),
    PoolGroup("gpu-spot-b", "gpu-spot-b-group", "g5.xlarge", ("us-east-1b",), spot=True),
]
SCALE = 100.0  # the stack's clock: a boot of 180 s takes 1.8 s here


@pytest.fixture(scope="module")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(log_path=str(tmp_path_factory.mktemp("moto") / "moto.log")) as moto:
        yield moto


def _system(moto: MotoServer, tmp_path: Path, lines: list[str], **kw: Any) -> LocalSystem:
    moto.reset()
    system = LocalSystem(moto.endpoint, tmp_path, on_change=lines.append, reconcile_every=3600, **kw)
    system.add_pools(POOLS)
    return system


@pytest.fixture
def saved_environment() -> Iterator[None]:
    saved = dict(os.environ)
    try:
        yield
    finally:
        clients.reset()
        os.environ.clear()
        os.environ.update(saved)


def _run_task(system: LocalSystem, provider: str) -> dict[str, Any]:
    td = system.task_definition([sys.executable, "-c", "import time; time.sleep(60)"], family="sleep")
    ecs = clients.client("ecs")  # SpotGuard's own client: the scheduler's hooks answer its RunTask
    return dict(
        ecs.run_task(
            cluster="gpu-spot",
            taskDefinition=td,
            capacityProviderStrategy=[{"capacityProvider": provider, "weight": 1}],
            startedBy="spotguard/test/1",
        )
    )


def _group(system: LocalSystem, name: str) -> dict[str, Any]:
    asg = system.stack.client("autoscaling")
    return dict(asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0])


def test_a_task_waits_provisioning_until_its_instance_boots_and_joins(
    moto_server: MotoServer, tmp_path: Path, saved_environment: None
) -> None:
    lines: list[str] = []
    system = _system(moto_server, tmp_path, lines, time_scale=SCALE, boot_seconds=180, scale_out_seconds=60)
    try:
        assert system.boot is not None
        a = system.add_pool_host("gpu-spot-a")  # booted already, from its group
        assert [i["InstanceId"] for i in _group(system, "gpu-spot-a-group")["Instances"]] == [a.instance_id]

        (task,) = _run_task(system, "gpu-spot-b")["tasks"]
        arn = task["taskArn"]
        assert task["lastStatus"] == "PROVISIONING" and not task.get("containerInstanceArn")
        system.pump()
        assert arn not in system.runner.running  # no instance: no agent starts it
        assert _group(system, "gpu-spot-b-group")["DesiredCapacity"] == 0  # managed scaling not yet

        assert system.run_until(lambda: arn in system.runner.running, timeout=30, every=0.05)
        (boot,) = [b for b in system.boot.launched if b.pool.group == "gpu-spot-b-group"]
        host, _ = system.boot.joined[boot.instance_id]
        waited = (boot.joins_at - boot.launched_at).total_seconds()
        assert boot.why == "managed scaling" and waited == 180
        described = system.cluster.tasks([arn])[arn]
        assert described["containerInstanceArn"] == host.container_instance_arn
        assert system.cluster.describe_host(host)["runningTasksCount"] == 1
        assert any(f"{boot.instance_id} joined gpu-spot-b" in w for w in lines)
        assert any("PROVISIONING: no instance of gpu-spot-b" in w for w in lines)

        system.take_away(a)  # spot takes it back: the group launches a replacement, which boots
        system.pump()
        assert a not in system.cluster.hosts
        (replacement,) = [b for b in system.boot.booting.values() if b.pool.group == "gpu-spot-a-group"]
        assert replacement.why == "replacement" and replacement.instance_id != a.instance_id
        assert not system.guard.denied
    finally:
        system.close()


def test_without_the_boot_model_the_local_stack_is_as_before(
    moto_server: MotoServer, tmp_path: Path, saved_environment: None
) -> None:
    system = _system(moto_server, tmp_path, [])
    try:
        assert system.boot is None
        a = system.add_pool_host("gpu-spot-a")
        group = _group(system, "gpu-spot-a-group")
        assert group["DesiredCapacity"] == 0 and group["Instances"] == []  # added by hand, as before
        answer = _run_task(system, "gpu-spot-b")
        assert answer["tasks"] == [] and answer["failures"] == [{"reason": "RESOURCE:GPU"}]
        (task,) = _run_task(system, "gpu-spot-a")["tasks"]
        assert task["containerInstanceArn"] == a.container_instance_arn
    finally:
        system.close()


def test_the_local_operations_have_a_route_of_their_own_with_one_line_refusals(
    moto_server: MotoServer,
) -> None:
    """The local stack's own ECS operations never ride on moto's ECS dispatch (moto 5.2.6 answered 404 to
    them there): they have `/spotguard-local/`, which refuses what it does not know with a JSON error."""
    import json
    import urllib.error
    import urllib.request

    from spotguard_cli.emulator import motopatch

    def post(path: str, data: bytes) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(moto_server.endpoint + path, data=data, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    code, answer = post("/spotguard-local/SpotguardDeleteEverything", b"{}")
    assert code == 404
    assert answer == {
        "error": "no local operation 'SpotguardDeleteEverything' (POST one of SpotguardProvisionTask, "
        "SpotguardPlaceTask)"
    }
    code, answer = post("/spotguard-local/SpotguardPlaceTask", b"[1]")
    assert code == 400 and answer["error"] == "ValueError: a local operation's body is a JSON object"
    code, answer = post("/spotguard-local/SpotguardPlaceTask", b'{"region": "us-east-1"}')
    assert code == 400 and answer["error"].startswith("KeyError")
    with pytest.raises(RuntimeError, match=r"moto server refused SpotguardProvisionTask \(400\)"):
        motopatch.call_local_ecs(moto_server.endpoint, "us-east-1", "SpotguardProvisionTask", {})
    # moto's own routes are untouched
    with urllib.request.urlopen(moto_server.endpoint + "/moto-api/", timeout=10) as resp:
        assert resp.status == 200
