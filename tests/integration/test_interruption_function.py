"""The interruption function end to end against moto: queue records in, AWS calls and ledger out."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest
from botocore.stub import ANY, Stubber

from spotguard.adapters import clients
from spotguard_cli.emulator.inject import make_event

from .conftest import fresh_aws, make_world

pytestmark = pytest.mark.slow  # every test deploys the stack into moto


def _desired(world, arns):
    tasks = world.cluster.tasks(arns)
    return {a: tasks[a]["desiredStatus"] for a in arns}


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_spot_warning_drains_the_host_and_stops_its_managed_gpu_tasks(world, gpus):
    td = world.cluster.gpu_task_definition("train", gpus=gpus)
    managed = world.cluster.start(world.a, td, count=2)
    other_host = world.cluster.start(world.b, td, count=1)
    unmanaged = world.cluster.start(world.a, world.cluster.cpu_task_definition(), managed=False)
    world.index(world.a, world.b)

    world.send(world.warning(world.a))
    assert world.run() == (1, 0)

    assert world.cluster.describe_host(world.a)["status"] == "DRAINING"
    assert world.cluster.describe_host(world.b)["status"] == "ACTIVE"
    assert set(_desired(world, managed).values()) == {"STOPPED"}
    assert _desired(world, other_host + unmanaged) == {other_host[0]: "RUNNING", unmanaged[0]: "RUNNING"}
    assert world.calls.count("StopTask") == 2
    reason = world.cluster.tasks(managed)[managed[0]]["stoppedReason"]
    assert reason.startswith("SpotGuard: spot-interruption ") and world.a.instance_id in reason
    # index hit: no lookup across clusters on the way to the signal
    assert "ListContainerInstances" not in world.calls


def test_duplicate_delivery_and_a_second_source_stop_each_task_once(world):
    managed = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=3)
    world.index(world.a)
    warning = world.warning(world.a)
    world.send(warning)
    world.run()
    body = world.poller.delivered[-1]
    # The same record delivered again (three times), interleaved with the state change that follows.
    world.send(
        body, make_event("instance-state-change", world.a.instance_id, state="shutting-down"), body, body
    )
    assert world.run() == (4, 0)
    assert world.calls.count("StopTask") == 3
    assert set(_desired(world, managed).values()) == {"STOPPED"}
    notices = world.host.module.runtime.ledger.notices(world.a.instance_id)
    assert sorted(n["kind"] for n in notices) == ["instance-state-change", "spot-interruption"]
    later = next(n for n in notices if n["kind"] == "instance-state-change")
    assert "already stopped" in json.loads(later["outcome"])["skipped"]


def test_shuffled_replays_reach_the_same_end_state():
    outcomes = set()
    for seed in range(3):
        with fresh_aws():
            world = make_world()
            managed = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=2)
            events = [
                world.warning(world.a),
                make_event("instance-state-change", world.a.instance_id, state="shutting-down"),
                make_event("rebalance-recommendation", world.b.instance_id),
            ]
            bodies = [json.dumps(e) for e in events] * 3
            random.Random(seed).shuffle(bodies)
            world.send(*bodies)
            world.run()
            outcomes.add((world.calls.count("StopTask"), tuple(sorted(_desired(world, managed).values()))))
    assert outcomes == {(2, ("STOPPED", "STOPPED"))}


def test_without_an_index_the_host_is_found_by_lookup(world):
    managed = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=1)
    world.send(world.warning(world.a))
    assert world.run() == (1, 0)
    assert _desired(world, managed) == {managed[0]: "STOPPED"}
    assert "ListContainerInstances" in world.calls


def test_a_notice_for_an_instance_with_no_managed_task_drains_and_stops_nothing(world):
    unmanaged = world.cluster.start(world.a, world.cluster.cpu_task_definition(), managed=False)
    world.index(world.a)
    world.send(world.warning(world.a))
    assert world.run() == (1, 0)
    assert world.cluster.describe_host(world.a)["status"] == "DRAINING"
    assert "StopTask" not in world.calls and _desired(world, unmanaged) == {unmanaged[0]: "RUNNING"}


def test_a_notice_for_an_instance_outside_the_watched_clusters_touches_nothing(world):
    world.send(make_event("spot-interruption", "i-0123456789abcdef0"))
    assert world.run() == (1, 0)
    assert not {"UpdateContainerInstancesState", "StopTask"} & set(world.calls)


def test_rebalance_checkpoint_signals_over_ssm_and_leaves_tasks_running(world):
    managed = world.cluster.start(world.b, world.cluster.gpu_task_definition(gpus=4), count=2)
    world.index(world.b)
    sent = []  # moto's list_commands adds instances of its own: assert on the request botocore validated
    clients.client("ssm").meta.events.register(
        "before-parameter-build.ssm.SendCommand", lambda params, **_: sent.append(params)
    )
    world.send(make_event("rebalance-recommendation", world.b.instance_id))
    assert world.run() == (1, 0)
    assert set(_desired(world, managed).values()) == {"RUNNING"}
    assert world.cluster.describe_host(world.b)["status"] == "ACTIVE"
    (cmd,) = sent
    document = world.stack.functions["InterruptionFunction"].environment["SPOTGUARD_SIGNAL_DOCUMENT"]
    assert cmd["InstanceIds"] == [world.b.instance_id] and cmd["DocumentName"] == document
    params = cmd["Parameters"]
    assert params["signal"] == ["SIGUSR1"] and params["containerIds"] == [""]  # moto reports no runtime ids
    (pairs,) = params["taskContainers"]
    assert sorted(p.split("=")[0] for p in pairs.split()) == sorted(managed)


@pytest.mark.parametrize(("mode", "stops", "drained"), [("drain", 1, "DRAINING"), ("ignore", 0, "ACTIVE")])
def test_rebalance_modes(aws, mode, stops, drained):
    world = make_world({"RebalanceAction": mode})
    world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=1)
    world.index(world.a)
    world.send(make_event("rebalance-recommendation", world.a.instance_id))
    assert world.run() == (1, 0)
    assert world.calls.count("StopTask") == stops and "SendCommand" not in world.calls
    assert world.cluster.describe_host(world.a)["status"] == drained


def test_all_gpu_mode_stops_untagged_gpu_tasks_too(aws):
    world = make_world({"ManagedTasks": "all-gpu"})
    gpu = world.cluster.start(world.a, world.cluster.gpu_task_definition(), managed=False)
    cpu = world.cluster.start(world.a, world.cluster.cpu_task_definition(), managed=False)
    world.index(world.a)
    world.send(world.warning(world.a))
    world.run()
    assert _desired(world, gpu + cpu) == {gpu[0]: "STOPPED", cpu[0]: "RUNNING"}


def test_health_event_acts_on_every_named_instance(world):
    ta = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=1)
    tb = world.cluster.start(world.b, world.cluster.gpu_task_definition(), count=1)
    world.index(world.a, world.b)
    event = make_event("health-maintenance", world.a.instance_id)
    event["detail"]["affectedEntities"] = [
        {"entityValue": world.a.instance_id},
        {"entityValue": world.b.instance_id},
    ]
    world.send(event)
    assert world.run() == (1, 0)
    assert set(_desired(world, ta + tb).values()) == {"STOPPED"}


def test_bad_records_go_straight_to_the_dead_letter_queue_and_the_batch_goes_on(world):
    managed = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=1)
    world.index(world.a)
    placeholder = make_event("spot-interruption", world.a.instance_id)
    placeholder["detail"]["instance-id"] = "<instance-id>"
    world.send("{oops", placeholder, world.warning(world.a))
    assert world.run() == (3, 0)  # nothing failed: the bad ones were dead-lettered, the good one acted on
    assert _desired(world, managed) == {managed[0]: "STOPPED"}
    reasons = sorted(
        m["MessageAttributes"]["spotguard-reject-reason"]["StringValue"] for m in world.dead_letters()
    )
    assert len(reasons) == 2
    assert reasons[0].startswith("detail.instance-id: holds a placeholder") or "placeholder" in " ".join(
        reasons
    )
    assert any(r.startswith("not valid JSON") for r in reasons)


def test_a_transient_failure_fails_only_its_record_and_the_retry_completes(world):
    managed = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=2)
    world.index(world.a)
    ecs = clients.client("ecs")
    state = {"failed": False}

    def throttle_once(model, params, **_):
        if model.name == "StopTask" and not state["failed"]:
            state["failed"] = True
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "ServerException", "Message": "boom"}}, "StopTask")

    ecs.meta.events.register("before-call.ecs.StopTask", throttle_once)
    world.send(
        world.warning(world.a), make_event("instance-state-change", "i-0123456789abcdef0", state="terminated")
    )
    delivered, failed = world.poller.poll_once()
    assert (delivered, failed) == (2, 1)
    ecs.meta.events.unregister("before-call.ecs.StopTask", throttle_once)
    # SQS makes the failed record visible again after the visibility timeout (by then the failed try's
    # lease has run out); hand it back now, and move the function's clock that far.
    later = datetime.now(UTC) + timedelta(seconds=61)
    world.host.module.runtime.service.clock = lambda: later
    for receipt in world.poller.failed_receipts:
        world.sqs.change_message_visibility(
            QueueUrl=world.poller.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
        )
    world.run()
    assert set(_desired(world, managed).values()) == {"STOPPED"}
    assert world.calls.count("StopTask") == 3  # 2 tries (one failed) + the retried one; none twice


def test_lifecycle_action_waits_for_tasks_then_completes(world):
    managed = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=1)
    world.index(world.a)
    asg = clients.client("autoscaling")
    hook = {
        "LifecycleHookName": "spotguard-drain",
        "AutoScalingGroupName": "gpu-spot-asg",
        "LifecycleActionToken": "87654321-4321-4321-4321-210987654321",
        "InstanceId": world.a.instance_id,
    }
    with Stubber(asg) as stub:  # moto has neither call: assert on the requests botocore validated
        stub.add_response("record_lifecycle_action_heartbeat", {}, hook)
        stub.add_response("complete_lifecycle_action", {}, {**hook, "LifecycleActionResult": "CONTINUE"})
        world.send(make_event("lifecycle-terminate", world.a.instance_id))
        assert world.poller.poll_once() == (1, 0)
        assert _desired(world, managed) == {managed[0]: "STOPPED"}
        # The follow-up check is on the queue; the task has stopped (moto stops at once), so it completes.
        assert world.poller.poll_once() == (1, 0)
        stub.assert_no_pending_responses()
        assert world.run() == (0, 0)  # nothing left waiting


def test_lifecycle_for_an_idle_host_completes_at_once(world):
    world.index(world.a)
    asg = clients.client("autoscaling")
    with Stubber(asg) as stub:
        stub.add_response(
            "complete_lifecycle_action",
            {},
            {
                "LifecycleHookName": ANY,
                "AutoScalingGroupName": ANY,
                "LifecycleActionToken": ANY,
                "LifecycleActionResult": "CONTINUE",
                "InstanceId": world.a.instance_id,
            },
        )
        world.send(make_event("lifecycle-terminate", world.a.instance_id))
        assert world.run() == (1, 0)
        stub.assert_no_pending_responses()


def test_container_instance_events_keep_the_index_and_drop_stale_ones(world):
    ledger = world.host.module.runtime.ledger
    desc = world.cluster.describe_host(world.a)
    from spotguard_cli.emulator.inject import container_instance_event

    newer = container_instance_event({**desc, "status": "DRAINING", "version": 7})
    older = container_instance_event({**desc, "status": "ACTIVE", "version": 6})
    world.send(newer, older)
    world.run()
    ref = ledger.container_instance(world.a.instance_id)
    assert ref is not None and ref.status == "DRAINING"


def test_the_function_works_with_tracing_on(aws):
    # EnableTracing=true: the handler is wrapped by a Powertools Tracer (sending is off in tests).
    world = make_world(env={"SPOTGUARD_TRACING": "true", "POWERTOOLS_TRACE_DISABLED": "true"})
    assert world.host.module._tracer is not None
    managed = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=1)
    world.index(world.a)
    world.send(world.warning(world.a))
    assert world.run() == (1, 0)
    assert _desired(world, managed) == {managed[0]: "STOPPED"}


def _index_tasks(world, arns):
    """What the task-events function records from the tasks' RUNNING events: the host's task index."""
    from spotguard.adapters.ecs import task_info

    ecs = world.stack.client("ecs")
    ledger = world.host.module.runtime.ledger
    for t in ecs.describe_tasks(cluster="gpu-spot", tasks=arns, include=["TAGS"])["tasks"]:
        ledger.index_task(task_info(t), 2, datetime.now(UTC))


@pytest.mark.parametrize("n", [1, 4, 8])
def test_four_calls_go_before_the_stops_whatever_the_number_of_tasks(world, n):
    """The urgent path's length, as botocore sees it: the host query, ListTasks and the task index (side
    by side), the claim; then one StopTask per task with the drain beside them; the record after."""
    managed = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=n)
    world.index(world.a)
    _index_tasks(world, managed)
    world.calls.clear()
    world.send(world.warning(world.a))
    assert world.run() == (1, 0)
    # the stops and the drain go side by side: either may reach botocore first
    first_stop = min(world.calls.index("StopTask"), world.calls.index("UpdateContainerInstancesState"))
    assert sorted(world.calls[:first_stop]) == ["ListTasks", "Query", "Query", "UpdateItem"]
    assert sorted(world.calls[first_stop:]) == sorted(
        ["StopTask"] * n + ["UpdateContainerInstancesState", "UpdateItem"]
    )
    assert world.calls[-1] == "UpdateItem"  # the notice's record, after every signal
    assert set(_desired(world, managed).values()) == {"STOPPED"}


def test_two_copies_of_a_notice_in_one_batch_stop_each_task_once(world):
    """The records of a batch are handled side by side: two copies of one warning race to the claim; the
    loser is retried (or finds the winner's outcome) and stops nothing."""
    managed = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=3)
    world.index(world.a)
    body = json.dumps(world.warning(world.a))
    world.send(body, body, body)
    world.run()
    later = datetime.now(UTC) + timedelta(seconds=61)  # the visibility timeout passes: leases run out
    world.host.module.runtime.service.clock = lambda: later
    for receipt in world.poller.failed_receipts:
        world.sqs.change_message_visibility(
            QueueUrl=world.poller.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
        )
    world.run()
    assert world.calls.count("StopTask") == 3
    assert set(_desired(world, managed).values()) == {"STOPPED"}
    (notice,) = world.host.module.runtime.ledger.notices(world.a.instance_id)
    assert sorted(json.loads(notice["outcome"])["signalled"]) == sorted(managed)
    assert world.dead_letters() == []


def test_batches_one_at_a_time_are_timed_and_each_carries_its_records(world):
    """`drain_one_by_one` (bench/local_load.py --isolated): each batch alone, in order, with its bodies."""
    td = world.cluster.gpu_task_definition()
    managed = world.cluster.start(world.a, td, count=2) + world.cluster.start(world.b, td, count=1)
    world.index(world.a, world.b)
    world.poller.batch_size = 1
    world.send(world.warning(world.a), world.warning(world.b))

    invocations, failed = world.poller.drain_one_by_one()

    assert failed == 0 and len(invocations) == 2
    first, second = invocations
    assert first.started <= first.ended <= second.started <= second.ended
    named = sorted(inv.bodies[0].count(world.a.instance_id) > 0 for inv in invocations)
    assert named == [False, True] and all(len(inv.bodies) == 1 for inv in invocations)
    assert set(_desired(world, managed).values()) == {"STOPPED"}
    assert world.poller.drain_one_by_one() == ([], 0)
