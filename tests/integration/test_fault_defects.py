"""The smallest reproductions of the defects the fault cases found: each was marked xfail(strict=True)
with the defect until it was fixed, and now guards against its return."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from moto.ecs.models import ecs_backends

from spotguard.adapters import clients
from spotguard_cli.emulator.inject import make_event
from tests.integration.conftest import fresh_aws, make_world

pytestmark = pytest.mark.slow  # each case deploys the stack into moto


def test_a_lifecycle_action_waits_for_every_task_its_notice_stopped():
    """A notice redelivered after a partial StopTask failure recorded only the tasks the redelivery
    stopped, and the lifecycle action completed while a task the first delivery stopped was still writing
    its checkpoint. The claim now names every task the notice stops, on every try."""
    with fresh_aws():
        world = make_world(env={"SPOTGUARD_LIFECYCLE_CHECK_SECONDS": "30"})  # the follow-up waits
        first, second = world.cluster.start(world.a, world.cluster.gpu_task_definition(), count=2)
        world.index(world.a)
        completed: list[dict] = []

        def lifecycle(model, params, **_):  # moto has neither lifecycle call: answer them here
            if model.name == "CompleteLifecycleAction":
                completed.append(params)
            return AWSResponse("local://autoscaling", 200, {}, None), {}

        def throttled(params, **_):  # StopTask of `second` fails beyond botocore's retries, once
            if second in params["body"].decode() and not throttled.done:
                throttled.done = True
                raise ClientError(
                    {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "StopTask"
                )

        throttled.done = False
        clients.on_event("before-call.autoscaling.CompleteLifecycleAction", lifecycle)
        clients.on_event("before-call.autoscaling.RecordLifecycleActionHeartbeat", lifecycle)
        clients.on_event("before-call.ecs.StopTask", throttled)

        world.send(make_event("lifecycle-terminate", world.a.instance_id))
        assert world.poller.poll_once() == (1, 1)  # `first` stopped; the record failed on `second`
        # `first` is stopping: its agent is writing the checkpoint (ECS keeps it out of ListTasks RUNNING)
        task = ecs_backends["123456789012"]["us-east-1"].tasks["gpu-spot"][first]
        task.last_status = "DEACTIVATING"
        later = datetime.now(UTC) + timedelta(seconds=61)  # the visibility timeout passes (and the lease)
        world.host.module.runtime.service.clock = lambda: later
        for receipt in world.poller.failed_receipts:  # the visibility timeout passes: SQS delivers it again
            world.sqs.change_message_visibility(
                QueueUrl=world.poller.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
            )
        world.run()  # the redelivery stops `second`, then the lifecycle follow-up checks

        assert completed == [], "the instance was let go while a task it ran was still stopping"
        (notice,) = world.host.module.runtime.ledger.notices(world.a.instance_id)
        assert sorted(json.loads(notice["outcome"])["signalled"]) == sorted([first, second])
