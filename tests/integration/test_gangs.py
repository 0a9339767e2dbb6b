"""Multi-node jobs (gangs) through the stack's functions over moto: an N-node attempt is N RunTask
placements (node 0 first, then the others with its address), a gang that cannot be placed whole is stopped
and tried again, and one node's warning or loss brings exactly one relaunch of the whole gang from the
same checkpoint, however the nodes' events arrive. The pure rules: tests/unit/test_gangs.py."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from spotguard.adapters import clients
from spotguard_cli.emulator.gpucluster import Host
from spotguard_cli.emulator.world import JobsWorld

pytestmark = pytest.mark.slow  # every test deploys the stack into moto


def _env(request: dict[str, Any]) -> dict[str, str]:
    (override,) = request["overrides"]["containerOverrides"]
    return {e["name"]: e["value"] for e in override["environment"]}


def _private_ip(jobs: JobsWorld, host: Host) -> str:
    (r,) = jobs.stack.client("ec2").describe_instances(InstanceIds=[host.instance_id])["Reservations"]
    return r["Instances"][0]["PrivateIpAddress"]


def _host_of(jobs: JobsWorld, arn: str) -> Host:
    placed = jobs.scheduler.placed[arn]
    return next(h for h in jobs.hosts.values() if h.container_instance_arn == placed)


@pytest.fixture
def gang_world(jobs: JobsWorld) -> JobsWorld:
    """Two more single-GPU hosts, one a zone, so a 2-node gang of g5.xlarge fits in either zone."""
    jobs.hosts["a1b"] = jobs.cluster.add_host("g5.xlarge", "us-east-1a")
    jobs.hosts["b1b"] = jobs.cluster.add_host("g5.xlarge", "us-east-1b")
    return jobs


def _formed(jobs: JobsWorld, nodes: int = 2) -> tuple[dict[str, Any], list[str]]:
    """Submit an N-node job and run it until every node runs: its task ARNs, node 0 first."""
    job = jobs.submit(gpus=1, nodes=nodes)
    arn0 = job["task_arn"]
    jobs.emit(arn0)  # node 0 RUNNING: the others are launched with its address
    status = jobs.status(job["job_id"])
    arns = [arn0, *(p["task_arn"] for p in status["attempts"][-1]["peers"])]
    assert len(arns) == nodes
    for arn in arns[1:]:
        jobs.emit(arn)
    return job, arns


def test_an_n_node_attempt_is_n_placements_each_told_the_rendezvous(gang_world: JobsWorld):
    jobs = gang_world
    job = jobs.submit(gpus=1, nodes=2)
    (first,) = jobs.scheduler.requests  # node 0 alone until it runs
    env0 = _env(first)
    assert env0["SPOTGUARD_NODE_RANK"] == "0" and env0["PET_NNODES"] == "2" and "PET_MASTER_ADDR" not in env0
    assert first["startedBy"] == f"spotguard/{job['job_id']}/1"
    host0 = _host_of(jobs, job["task_arn"])

    jobs.emit(job["task_arn"])  # RUNNING
    assert len(jobs.scheduler.requests) == 2
    second = jobs.scheduler.requests[1]
    env1 = _env(second)
    address = _private_ip(jobs, host0)
    assert env1["PET_MASTER_ADDR"] == address and env1["PET_NODE_RANK"] == "1"
    assert env1["SPOTGUARD_RENDEZVOUS"] == f"{address}:29500"
    assert env1["SPOTGUARD_ATTEMPT"] == "1" and env1["SPOTGUARD_CHECKPOINT_URI"] == job["checkpoint_uri"]
    assert second["startedBy"] == f"spotguard/{job['job_id']}/1/1"
    assert {"key": "spotguard:node", "value": "1"} in second["tags"]
    expressions = [c["expression"] for c in second["placementConstraints"]]
    assert f"ec2InstanceId !in [{host0.instance_id}]" in expressions
    assert any("ecs.instance-type == g5.xlarge" in e and "us-east-1a" in e for e in expressions)
    status = jobs.status(job["job_id"])
    (peer,) = status["attempts"][0]["peers"]
    host1 = _host_of(jobs, peer["task_arn"])
    assert host1 is not host0 and host1.availability_zone == host0.availability_zone  # one pool
    jobs.emit(peer["task_arn"])
    status = jobs.status(job["job_id"])
    assert status["attempts"][0]["formed_at"] and "all 2 nodes" in status["last_reason"]
    # a repeated RUNNING of node 0 launches nothing more
    jobs.emit(job["task_arn"])
    assert len(jobs.scheduler.requests) == 2


@pytest.mark.parametrize("seed", range(3))
def test_a_warning_for_one_node_stops_every_node_once_and_relaunches_the_gang_once(gang_world, seed):
    jobs = gang_world
    job, (arn0, arn1) = _formed(jobs)
    newest = jobs.commit_checkpoint(job, 1)
    warned = _host_of(jobs, arn1)
    stopped_tasks: list[str] = []
    clients.on_every_call(
        lambda model, params, **_: stopped_tasks.append(params["task"]) if model.name == "StopTask" else None
    )
    jobs.interrupt(warned)  # the interruption function stops node 1's task for the warning
    assert jobs.task(arn1)["stoppedReason"].startswith("SpotGuard: spot-interruption")
    # ECS's event for node 1 being stopped (still running, desired STOPPED): node 0 is stopped too
    stopping = jobs.event(arn1)
    stopping["detail"].update(lastStatus="RUNNING", desiredStatus="STOPPED")
    jobs.put(stopping)
    jobs.task_events.drain()
    assert jobs.task(arn0)["stoppedReason"].startswith("SpotGuard: gang of job")
    jobs.put(stopping)  # repeated: nothing more
    jobs.task_events.drain()
    # both nodes exit 75 on the one checkpoint; their STOPPED events three times each, shuffled
    stopped = [jobs.event(arn0, exit_code=75), jobs.event(arn1, exit_code=75)] * 3
    random.Random(seed).shuffle(stopped)
    for e in stopped:
        jobs.put(e)
    jobs.task_events.drain()

    assert sorted(stopped_tasks) == sorted([arn0, arn1])  # every node signalled (SIGTERM) once
    requests = jobs.scheduler.requests
    assert len(requests) == 3  # node 0 of attempt 2, once
    assert (
        _env(requests[2])["SPOTGUARD_RESUME_FROM"] == newest and _env(requests[2])["SPOTGUARD_ATTEMPT"] == "2"
    )
    status = jobs.status(job["job_id"])
    a1, a2 = status["attempts"]
    assert a1["outcome"] == "resubmit" and a1["outcome_reason"].startswith("node ")
    assert warned.instance_id in status["avoiding"]["instances"]
    jobs.emit(a2["task_arn"])  # node 0 of attempt 2 runs: node 1 is launched, from the same checkpoint
    assert len(jobs.scheduler.requests) == 4
    env = _env(jobs.scheduler.requests[3])
    assert env["SPOTGUARD_RESUME_FROM"] == newest and env["SPOTGUARD_NODE_RANK"] == "1"
    hosts = {_host_of(jobs, a2["task_arn"]).instance_id}
    hosts.add(_host_of(jobs, jobs.status(job["job_id"])["attempts"][1]["peers"][0]["task_arn"]).instance_id)
    assert warned.instance_id not in hosts and len(hosts) == 2


def test_a_node_lost_without_a_notice_stops_the_rest_and_one_relaunch_follows(gang_world: JobsWorld):
    jobs = gang_world
    job, (arn0, arn1) = _formed(jobs)
    lost = _host_of(jobs, arn1)
    jobs.stop(arn1, reason=f"Host EC2 (instance {lost.instance_id}) terminated.", exit_code=137)
    jobs.emit(arn1, exit_code=137)
    assert jobs.task(arn0)["stoppedReason"].startswith("SpotGuard: gang of job")
    assert len(jobs.scheduler.requests) == 2  # nothing relaunched while node 0 still stops
    jobs.emit(arn0, exit_code=143)
    jobs.emit(arn0, exit_code=143)  # repeated
    assert len(jobs.scheduler.requests) == 3
    status = jobs.status(job["job_id"])
    assert (
        status["attempts"][0]["outcome"] == "resubmit"
        and "host went away" in status["attempts"][0]["outcome_reason"]
    )
    assert status["avoiding"]["instances"] == [lost.instance_id]


def test_a_gang_that_cannot_be_placed_whole_is_stopped_and_tried_again(jobs: JobsWorld):
    """Three 8-GPU nodes, and one 8-GPU host in node 0's zone: node 1 cannot be placed. The started
    node is stopped at once; the job waits, costs no attempt, and forms once the hosts are there."""
    job = jobs.submit(gpus=8, nodes=3)
    arn0 = job["task_arn"]
    jobs.emit(arn0)  # node 0 runs; node 1's RunTask finds no room beside it in its pool
    assert jobs.task(arn0)["stoppedReason"].startswith("SpotGuard: gang of job")
    jobs.emit(arn0, exit_code=143)
    status = jobs.status(job["job_id"])
    assert status["state"] == "queued" and status["retry_at"] is not None
    assert status["attempts"][0]["abandoned"].startswith("node 1")
    # capacity comes: two more 8-GPU hosts in the other zone (the pool it did not form in is kept off
    # for a while); the retry brings the gang back whole there
    zone = _host_of(jobs, arn0).availability_zone
    assert {"instance_type": "g5.48xlarge", "availability_zone": zone}.items() <= status["avoiding"]["pools"][
        0
    ].items()
    other = "us-east-1b" if zone == "us-east-1a" else "us-east-1a"
    jobs.hosts["x8b"] = jobs.cluster.add_host("g5.48xlarge", other)
    jobs.hosts["x8c"] = jobs.cluster.add_host("g5.48xlarge", other)
    jobs.shift_clock(400)  # past the wait (30 s, its retry message on the queue) and reconcile's bound
    jobs.reconcile()  # the sweep launches a due job whose retry message has not come (the backstop)
    status = jobs.status(job["job_id"])
    assert status["state"] == "running" and len(status["attempts"]) == 2
    jobs.emit(status["attempts"][1]["task_arn"])
    status = jobs.status(job["job_id"])
    assert len(status["attempts"][1]["peers"]) == 2
    for p in status["attempts"][1]["peers"]:
        jobs.emit(p["task_arn"])
    status = jobs.status(job["job_id"])
    assert status["attempts"][1]["formed_at"] is not None and status["state"] == "running"


def test_reconcile_gives_up_a_gang_that_does_not_form_within_the_bound(gang_world: JobsWorld):
    jobs = gang_world
    job = jobs.submit(gpus=1, nodes=2, provisioning_timeout_seconds=300)
    arn0 = job["task_arn"]
    jobs.emit(arn0)  # node 0 runs; node 1 is launched but never reaches RUNNING (in ECS too)
    (peer,) = jobs.status(job["job_id"])["attempts"][0]["peers"]
    _moto_task(peer["task_arn"]).last_status = "PROVISIONING"
    jobs.shift_clock(200)
    assert jobs.reconcile()["gangs_abandoned"] == 0  # within the bound
    jobs.shift_clock(400)
    assert jobs.reconcile()["gangs_abandoned"] == 1
    for arn in (arn0, peer["task_arn"]):
        assert "did not start on all 2 nodes" in jobs.task(arn)["stoppedReason"]
        jobs.emit(arn, exit_code=143)
    status = jobs.status(job["job_id"])
    assert status["state"] == "queued" and status["attempts"][0]["abandoned"].startswith("1 of 2 nodes")


def test_reconcile_stops_a_node_still_running_well_after_the_others_stopped_on_the_checkpoint(
    gang_world: JobsWorld,
):
    jobs = gang_world
    _, (arn0, arn1) = _formed(jobs)
    jobs.stop(arn0, exit_code=75)  # node 0 committed and exited 75; node 1 hangs
    jobs.emit(arn0, exit_code=75)
    assert jobs.task(arn1)["lastStatus"] != "STOPPED"  # it agreed: not cut at once
    jobs.shift_clock(600)
    assert jobs.reconcile()["gang_stragglers_stopped"] == 1
    assert "still running 180 s after another node stopped" in jobs.task(arn1)["stoppedReason"]
    jobs.emit(arn1, exit_code=143)
    assert len(jobs.scheduler.requests) == 3  # the gang's relaunch, once


def test_a_multi_node_job_that_cannot_run_as_one_is_refused_in_one_line(gang_world: JobsWorld):
    jobs = gang_world
    td = jobs.cluster.gpu_task_definition(gpus=1)
    request = {"cluster": "gpu-spot", "taskDefinition": td, "launchType": "FARGATE"}
    answer = jobs.invoke({"action": "submit", "request": request, "options": {"nodes": 2}})
    assert not answer["ok"] and "Fargate" in answer["error"]["message"]
    request["launchType"] = "EC2"
    answer = jobs.invoke({"action": "submit", "request": request, "options": {"nodes": 65}})
    assert not answer["ok"] and "options.nodes" in answer["error"]["message"]
    # bridge networking (ECS's default) publishes neither the rendezvous port nor NCCL's
    answer = jobs.invoke({"action": "submit", "request": request, "options": {"nodes": 2}})
    assert not answer["ok"] and "networkMode bridge" in answer["error"]["message"]
    request["taskDefinition"] = jobs.cluster.gpu_task_definition(gpus=1, network_mode="host")
    request["placementConstraints"] = [{"type": "memberOf", "expression": "attribute:x == y"}] * 8
    answer = jobs.invoke({"action": "submit", "request": request, "options": {"nodes": 2}})
    assert not answer["ok"] and "at most 7" in answer["error"]["message"]


def test_a_gang_that_did_not_form_is_tried_again_in_another_pool_without_a_capacity_policy(jobs: JobsWorld):
    """One 8-GPU host in us-east-1a and two in us-east-1b, no pools: node 0 is placed first-fit in
    us-east-1a, where node 1 has no room. The pool it did not form in is kept off, so the next gang forms
    in us-east-1b instead of being tried in us-east-1a for ever."""
    jobs.hosts["b8b"] = jobs.cluster.add_host("g5.48xlarge", "us-east-1b")
    job = jobs.submit(gpus=8, nodes=2)
    zones = []
    for round_ in range(3):
        status = jobs.status(job["job_id"])
        live = status["attempts"][-1]
        zones.append(_host_of(jobs, live["task_arn"]).availability_zone)
        jobs.emit(live["task_arn"])  # node 0 runs: node 1 is launched, or the gang given up
        status = jobs.status(job["job_id"])
        if status["attempts"][-1].get("peers"):
            break
        jobs.emit(live["task_arn"], exit_code=143)
        jobs.shift_clock(400 * (round_ + 1))
        jobs.reconcile()
    (peer,) = jobs.status(job["job_id"])["attempts"][-1]["peers"]
    jobs.emit(peer["task_arn"])
    status = jobs.status(job["job_id"])
    assert status["attempts"][-1]["formed_at"] is not None
    assert zones[-1] == "us-east-1b" and len(set(zones)) == len(zones)  # never the same pool again


def _moto_task(arn: str) -> Any:
    from moto.ecs.models import ecs_backends

    return ecs_backends["123456789012"]["us-east-1"].tasks["gpu-spot"][arn]


@pytest.mark.parametrize("lost", [0, 1])
def test_a_gang_running_in_ecs_whose_running_event_was_lost_is_not_given_up(gang_world: JobsWorld, lost: int):
    """Issue 45, item 2: with every node RUNNING in ECS and one node's RUNNING event lost, reconcile gave
    the gang up at the provisioning bound ("did not start on all 2 nodes"); with node 0's lost, the other
    nodes were never launched. Reconcile now takes a node's RUNNING from DescribeTasks, as a lost STOPPED."""
    jobs = gang_world
    job = jobs.submit(gpus=1, nodes=2)
    arn0 = job["task_arn"]
    if lost == 1:
        jobs.emit(arn0)  # node 0 runs; node 1 is launched, runs, and its RUNNING event is lost
    else:
        assert jobs.task(arn0)["lastStatus"] == "RUNNING"  # node 0's event lost: no peer launched yet
        assert jobs.status(job["job_id"])["attempts"][0]["peers"] == []
        jobs.shift_clock(300)
        counts = jobs.reconcile()
        assert counts["runs_applied"] == 1 and counts["gangs_abandoned"] == 0
        assert len(jobs.status(job["job_id"])["attempts"][0]["peers"]) == 1
        address = _private_ip(jobs, _host_of(jobs, arn0))  # the peer is told node 0's address
        assert _env(jobs.scheduler.requests[-1])["SPOTGUARD_RENDEZVOUS"] == f"{address}:29500"
    jobs.shift_clock(700)
    counts = jobs.reconcile()
    assert counts["gangs_abandoned"] == 0 and counts["runs_applied"] == 1
    status = jobs.status(job["job_id"])
    assert status["state"] == "running" and status["attempts"][0]["formed_at"] is not None
    for arn in [arn0, status["attempts"][0]["peers"][0]["task_arn"]]:
        assert jobs.task(arn)["lastStatus"] == "RUNNING"  # nothing stopped
    assert len(jobs.scheduler.requests) == 2  # each node launched once
    jobs.shift_clock(1400)
    assert jobs.reconcile()["runs_applied"] == 0  # a formed gang is not described again for this


def test_a_one_node_task_running_in_ecs_whose_running_event_was_lost_gets_its_start_applied(
    gang_world: JobsWorld,
):
    """The same for one node: a task ECS runs, still PENDING in the ledger, would be given up at the
    provisioning bound of its pool as one that never started."""
    jobs = gang_world
    job = jobs.submit(gpus=1)
    assert jobs.task(job["task_arn"])["lastStatus"] == "RUNNING"  # its RUNNING event is lost
    jobs.shift_clock(300)
    assert jobs.reconcile()["runs_applied"] == 1
    (attempt,) = jobs.status(job["job_id"])["attempts"]
    assert attempt["last_status"] == "RUNNING"
    jobs.shift_clock(600)
    assert jobs.reconcile()["runs_applied"] == 0  # seen running now: not described again


def _stop_task_fails_once() -> list[str]:
    """StopTask refused once (throttled beyond botocore's retries), as a live cancel met it; the ARNs
    whose StopTask was refused."""
    from botocore.exceptions import ClientError

    refused: list[str] = []

    def throttled(params: dict[str, Any], **_: Any) -> None:
        if not refused:
            refused.append(json.loads(params["body"])["task"])
            raise ClientError(
                {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "StopTask"
            )

    clients.on_event("before-call.ecs.StopTask", throttled)
    return refused


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_cancel_whose_stop_task_failed_is_completed_by_reconcile(gang_world: JobsWorld, nodes: int):
    """Issue 45, item 1: the cancel's first StopTask throttled left the job `running` ("cancelled by the
    user") with its tasks RUNNING through every later sweep. The cancel now records the attempt's stop,
    and reconcile asks again until no task runs; the job then ends cancelled."""
    jobs = gang_world
    if nodes == 1:
        job = jobs.submit(gpus=1)
        arns = [job["task_arn"]]
        jobs.emit(arns[0])
    else:
        job, arns = _formed(jobs, nodes)
    refused = _stop_task_fails_once()
    answer = jobs.invoke({"action": "cancel", "job_id": job["job_id"]})
    assert answer["ok"], answer  # taken: the stop that failed is asked again, not an InternalError
    assert len(refused) == 1 and jobs.task(refused[0])["lastStatus"] == "RUNNING"
    assert jobs.reconcile()["cancel_stops_retried" if nodes == 1 else "gang_stops_retried"] == 0  # recent
    jobs.shift_clock(600)
    counts = jobs.reconcile()
    assert counts["cancel_stops_retried" if nodes == 1 else "gang_stops_retried"] == 1
    for arn in arns:
        task = jobs.task(arn)
        assert task["lastStatus"] == "STOPPED" and task["stoppedReason"].startswith("SpotGuard: cancelled")
        jobs.emit(arn, exit_code=143)
    status = jobs.status(job["job_id"])
    assert status["state"] == "cancelled"
    assert len(jobs.scheduler.requests) == nodes  # nothing launched again
