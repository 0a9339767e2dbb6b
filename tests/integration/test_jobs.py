"""Jobs end to end over moto: submit, interruption, resubmission from the newest checkpoint, retries
for capacity, giving up, manual resubmit and cancel, adoption, and bad manual payloads."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from spotguard.adapters import clients
from spotguard.usecases.jobs.sweep import SweepCounts
from spotguard_cli.emulator.world import JobsWorld, make_jobs_world

from .conftest import fresh_aws

pytestmark = pytest.mark.slow  # every test deploys the stack into moto


def _env(request: dict) -> dict[str, str]:
    (override,) = request["overrides"]["containerOverrides"]
    return {e["name"]: e["value"] for e in override["environment"]}


@pytest.mark.parametrize(("gpus", "first", "second"), [(1, "a1", "b1"), (4, "a4", "b4"), (8, "a8", "b8")])
def test_an_interrupted_job_comes_back_once_from_its_newest_checkpoint(jobs: JobsWorld, gpus, first, second):
    job = jobs.submit(gpus=gpus)
    assert job["state"] == "running"
    (req1,) = jobs.scheduler.requests
    arn1 = job["task_arn"]
    assert jobs.scheduler.placed[arn1] == jobs.hosts[first].container_instance_arn
    env1 = _env(req1)
    assert env1["SPOTGUARD_ATTEMPT"] == "1" and env1["SPOTGUARD_RESUME_FROM"] == ""
    assert env1["SPOTGUARD_CHECKPOINT_URI"] == job["checkpoint_uri"]
    jobs.emit(arn1)  # RUNNING
    jobs.commit_checkpoint(job, 1)
    newest = jobs.commit_checkpoint(job, 2)

    calls: list[str] = []
    clients.on_every_call(lambda model, **_: calls.append(model.name))
    jobs.interrupt(jobs.hosts[first])  # the warning: drain, StopTask with SpotGuard's reason
    assert "ListTasks" in calls and "DescribeTasks" not in calls  # the task index knew the task
    assert jobs.task(arn1)["stoppedReason"].startswith("SpotGuard: spot-interruption")
    jobs.emit(arn1, exit_code=75)  # the agent committed and exited 75

    assert len(jobs.scheduler.requests) == 2  # exactly one resubmission
    req2 = jobs.scheduler.requests[1]
    env2 = _env(req2)
    assert env2["SPOTGUARD_RESUME_FROM"] == newest and env2["SPOTGUARD_ATTEMPT"] == "2"
    assert req2["taskDefinition"] == req1["taskDefinition"] and req2["launchType"] == "EC2"
    expressions = [c["expression"] for c in req2["placementConstraints"]]
    assert f"ec2InstanceId !in [{jobs.hosts[first].instance_id}]" in expressions
    assert any("g5." in e and "us-east-1a" in e for e in expressions)
    status = jobs.status(job["job_id"])
    assert status["state"] == "running" and status["gpus"] == gpus
    a1, a2 = status["attempts"]
    assert a1["outcome"] == "resubmit" and a1["interrupted_by"].startswith("spot-interruption")
    assert a1["instance_id"] == jobs.hosts[first].instance_id
    assert jobs.scheduler.placed[a2["task_arn"]] == jobs.hosts[second].container_instance_arn
    assert [c["sequence"] for c in status["checkpoints"]] == [1, 2]
    kinds = [e["detail"]["kind"] for e in jobs.job_events()]
    assert "interrupted" in kinds and "resubmitted" in kinds


def _end_state(jobs: JobsWorld, job_id: str) -> tuple:
    s = jobs.status(job_id)
    return (
        s["state"],
        len(s["attempts"]),
        [(a["outcome"], a.get("resume_from"), a["last_status"]) for a in s["attempts"]],
        len(jobs.scheduler.requests),
    )


@pytest.mark.parametrize("seed", range(5))
def test_task_events_replayed_five_times_and_shuffled_give_the_same_end_state(aws, seed):
    """Each attempt's events (RUNNING, then STOPPED) are delivered 5 times each, shuffled, in one go;
    then every event of the run again. One RunTask per attempt, and the same end state as in order."""
    rng = random.Random(seed)
    jobs = make_jobs_world()
    job = jobs.submit(gpus=4)
    arn1 = job["task_arn"]
    jobs.commit_checkpoint(job, 3)
    running1 = jobs.event(arn1)
    jobs.stop(arn1, "SpotGuard: spot-interruption 1 on i-0123456789abcdef0")
    stopped1 = jobs.event(arn1, exit_code=75)
    batch = [running1, stopped1] * 5
    rng.shuffle(batch)
    jobs.put(*batch)
    jobs.task_events.drain()
    assert len(jobs.scheduler.requests) == 2

    arn2 = jobs.status(job["job_id"])["attempts"][1]["task_arn"]
    running2 = jobs.event(arn2)
    jobs.stop(arn2, "Essential container in task exited")
    stopped2 = jobs.event(arn2, exit_code=0)
    batch = [running2, stopped2] * 5
    rng.shuffle(batch)
    jobs.put(*batch)
    jobs.task_events.drain()
    end = _end_state(jobs, job["job_id"])

    everything = [running1, stopped1, running2, stopped2] * 5
    rng.shuffle(everything)
    jobs.put(*everything)
    jobs.task_events.drain()
    assert _end_state(jobs, job["job_id"]) == end
    state, attempts, outcomes, run_tasks = end
    assert state == "succeeded" and attempts == 2 and run_tasks == 2
    assert outcomes[0][0] == "resubmit" and outcomes[1][0] == "succeeded"
    assert outcomes[0][2] == outcomes[1][2] == "STOPPED"  # a late RUNNING never undoes a STOPPED
    assert outcomes[1][1].endswith("checkpoints/00000003/MANIFEST.json")
    kinds = [e["detail"]["kind"] for e in jobs.job_events()]
    assert kinds.count("succeeded") == 1 and kinds.count("resubmitted") == 1


def test_no_capacity_waits_in_the_retry_queue_then_starts(jobs: JobsWorld):
    jobs.scheduler.refuse = 2  # RESOURCE:GPU twice
    job = jobs.submit(gpus=8)
    assert job["state"] == "queued" and job["retry_at"]
    assert "RESOURCE:GPU" in job["last_reason"]
    deadline = time.monotonic() + 30
    while jobs.status(job["job_id"])["state"] != "running" and time.monotonic() < deadline:
        jobs.retries.poll_once(wait_seconds=1)  # the retry queue's delays are 1 s, then 2 s here
    status = jobs.status(job["job_id"])
    assert status["state"] == "running" and len(status["attempts"]) == 1
    tokens = [r["clientToken"] for r in jobs.scheduler.requests]
    assert len(tokens) == 3 and len(set(tokens)) == 3  # a new try, a new token; never a second task
    events = jobs.job_events()
    kinds = [e["detail"]["kind"] for e in events]
    assert kinds.count("waiting") == 2 and kinds.count("capacity-wanted") == 2
    wanted = next(e for e in events if e["detail"]["kind"] == "capacity-wanted")
    assert wanted["detail-type"] == "SpotGuard Capacity Wanted" and wanted["detail"]["gpus"] == 8


def test_a_job_asking_more_gpus_than_any_instance_has_says_so_at_the_first_refusal(jobs: JobsWorld):
    """Issue 45, item 19: `--gpus 3` on 1-GPU instances read "RunTask placed no task: RESOURCE:GPU" at every
    try, for good. The first refusal says that nothing in the cluster can hold it."""
    td = jobs.cluster.gpu_task_definition(gpus=16)
    answer = jobs.invoke(
        {"action": "submit", "request": {"cluster": "gpu-spot", "taskDefinition": td, "launchType": "EC2"}}
    )
    job = answer["job"]
    assert job["state"] == "queued" and "RESOURCE:GPU" in job["last_reason"]
    assert "no instance in cluster gpu-spot has 16 GPUs (the most is 8)" in job["last_reason"]
    waiting = [e for e in jobs.job_events() if e["detail"]["kind"] == "waiting"]
    assert "no instance in cluster gpu-spot has 16 GPUs" in waiting[-1]["detail"]["message"]
    # a job that fits is told nothing of the kind when the instances are only busy
    jobs.scheduler.refuse = 1
    busy = jobs.submit(gpus=1)
    assert "RESOURCE:GPU" in busy["last_reason"] and "no instance in cluster" not in busy["last_reason"]


def test_max_attempts_gives_up_with_a_notification(jobs: JobsWorld):
    job = jobs.submit(gpus=1, max_attempts=2)
    for _ in range(2):
        arn = jobs.status(job["job_id"])["task_arn"]
        jobs.emit(arn)
        jobs.stop(arn, "SpotGuard: spot-interruption x on i-0123456789abcdef0")
        jobs.emit(arn, exit_code=75)
    status = jobs.status(job["job_id"])
    assert status["state"] == "gave-up" and len(status["attempts"]) == 2
    assert "max_attempts 2" in status["last_reason"]
    assert len(jobs.scheduler.requests) == 2
    mails = jobs.notifications()
    assert [m["kind"] for m in mails if m["kind"] == "gave-up"] == ["gave-up"]
    assert any(e["detail-type"] == "SpotGuard Job Gave Up" for e in jobs.job_events())


def test_a_failure_is_retried_up_to_max_error_retries_then_fails(jobs: JobsWorld):
    job = jobs.submit(gpus=1, max_error_retries=1)
    for _ in range(2):
        arn = jobs.status(job["job_id"])["task_arn"]
        jobs.stop(arn, "Essential container in task exited")
        jobs.emit(arn, exit_code=1)
    status = jobs.status(job["job_id"])
    assert status["state"] == "failed" and len(status["attempts"]) == 2
    assert "exit 1" in status["last_reason"]


def test_cancel_stops_the_task_and_resubmit_starts_it_again(jobs: JobsWorld):
    job = jobs.submit(gpus=1)
    arn1 = job["task_arn"]
    jobs.emit(arn1)
    first = jobs.commit_checkpoint(job, 1)
    jobs.commit_checkpoint(job, 2)

    busy = jobs.invoke({"action": "resubmit", "job_id": job["job_id"]})
    assert (
        not busy["ok"]
        and busy["error"]["type"] == "Conflict"
        and "cancel it first" in busy["error"]["message"]
    )

    answer = jobs.invoke({"action": "cancel", "job_id": job["job_id"]})
    assert answer["ok"]
    task = jobs.task(arn1)
    assert task["lastStatus"] == "STOPPED" and task["stoppedReason"].startswith("SpotGuard: cancelled")
    jobs.emit(arn1, exit_code=143)
    assert jobs.status(job["job_id"])["state"] == "cancelled"

    answer = jobs.invoke({"action": "resubmit", "job_id": job["job_id"], "checkpoint": first})
    assert answer["ok"] and answer["job"]["state"] == "running"
    assert _env(jobs.scheduler.requests[-1])["SPOTGUARD_RESUME_FROM"] == first
    listed = jobs.invoke({"action": "list", "state": "running"})
    assert [j["job_id"] for j in listed["jobs"]] == [job["job_id"]]


def test_a_tagged_task_spotguard_did_not_start_is_adopted_and_resubmitted(jobs: JobsWorld):
    td = jobs.cluster.gpu_task_definition(gpus=4)
    (arn,) = jobs.cluster.start(jobs.hosts["a4"], td, managed=True)
    jobs.emit(arn)
    status = jobs.status("adopted-" + arn.rsplit("/", 1)[-1])
    assert status["origin"] == "adopted" and status["state"] == "running" and status["gpus"] == 4
    assert status["request"]["taskDefinition"] == td
    jobs.stop(arn, "Host EC2 (instance i-0123456789abcdef0) terminated.")
    jobs.emit(arn, exit_code=None, stop_code="TerminationNotice")
    (req,) = jobs.scheduler.requests
    assert req["taskDefinition"] == td and req["startedBy"].startswith("spotguard/adopted-")
    assert {"key": "spotguard:managed", "value": "true"} in req["tags"]


def test_an_untagged_task_is_read_once_and_left_alone(jobs: JobsWorld):
    td = jobs.cluster.gpu_task_definition(gpus=1)
    (arn,) = jobs.cluster.start(jobs.hosts["a1"], td, managed=False)
    calls: list[str] = []
    from spotguard.adapters import clients

    clients.on_every_call(lambda model, **_: calls.append(model.name))
    jobs.emit(arn)
    jobs.emit(arn)
    assert calls.count("DescribeTasks") == 1
    assert jobs.invoke({"action": "list"})["jobs"] == []


def _deep(depth: int) -> object:
    node: object = "leaf"
    for _ in range(depth):
        node = {"a": node}
    return node


BAD = [
    ("not an object", ["submit"], "payload must be a JSON object"),
    ("unknown action", {"action": "delete", "job_id": "x"}, "action: must be one of"),
    ("a number for action", {"action": 1}, "action: must be one of"),
    ("a list for action", {"action": ["submit"]}, "action: must be one of"),
    (
        "nested too deeply",
        {
            "action": "submit",
            "request": {"cluster": "gpu-spot", "taskDefinition": "t", "overrides": _deep(5000)},
        },
        "nested too deeply",
    ),
    ("no request", {"action": "submit"}, "request: Field required"),
    (
        "count is SpotGuard's",
        {"action": "submit", "request": {"cluster": "gpu-spot", "taskDefinition": "t", "count": 2}},
        "request.count",
    ),
    (
        "startedBy is SpotGuard's",
        {"action": "submit", "request": {"cluster": "gpu-spot", "taskDefinition": "t", "startedBy": "me"}},
        "request.startedBy: Extra inputs are not permitted",
    ),
    (
        "an unwatched cluster",
        {"action": "submit", "request": {"cluster": "prod-web", "taskDefinition": "t"}},
        "not a watched cluster",
    ),
    (
        "a watched cluster's name in another region",
        {
            "action": "submit",
            "request": {
                "cluster": "arn:aws:ecs:eu-west-1:123456789012:cluster/gpu-spot",
                "taskDefinition": "t",
            },
        },
        "is in region eu-west-1, not the stack's us-east-1",
    ),
    (
        "a watched cluster's name in another account",
        {
            "action": "submit",
            "request": {
                "cluster": "arn:aws:ecs:us-east-1:210987654321:cluster/gpu-spot",
                "taskDefinition": "t",
            },
        },
        "is in account 210987654321, not the stack's 123456789012",
    ),
    (
        "a task of another account to resubmit",
        {
            "action": "resubmit",
            "task_arn": "arn:aws:ecs:us-east-1:210987654321:task/gpu-spot/0123456789abcdef0123456789abcdef",
        },
        "is in account 210987654321",
    ),
    (
        "an unknown task definition",
        {"action": "submit", "request": {"cluster": "gpu-spot", "taskDefinition": "nope:9"}},
        "request.taskDefinition",
    ),
    (
        "max_attempts out of range",
        {
            "action": "submit",
            "request": {"cluster": "gpu-spot", "taskDefinition": "t"},
            "options": {"max_attempts": 0},
        },
        "options.max_attempts",
    ),
    ("resubmit needs one target", {"action": "resubmit"}, "exactly one of job_id and task_arn"),
    ("a job id with a slash", {"action": "status", "job_id": "a/b"}, "job_id"),
    ("an unknown job", {"action": "cancel", "job_id": "no-such-job"}, "does not exist"),
    ("a bad state", {"action": "list", "state": "sleeping"}, "state"),
]


class TestRefusals:
    """Payloads the jobs function refuses. A refusal changes nothing, so the cases share one deployed
    world (one deploy instead of one per case); what each case asserts on is its own: the answer, and
    the RunTask requests, emptied before it."""

    @pytest.fixture(scope="class")
    @classmethod
    def shared(cls) -> Iterator[JobsWorld]:
        with fresh_aws():
            yield make_jobs_world()

    @pytest.fixture
    def jobs(self, shared: JobsWorld) -> JobsWorld:
        shared.scheduler.requests.clear()
        return shared

    @pytest.mark.parametrize(("why", "payload", "message"), BAD, ids=[b[0] for b in BAD])
    def test_bad_manual_payloads_get_a_clear_one_line_error(self, jobs: JobsWorld, why, payload, message):
        answer = jobs.invoke(payload)
        assert answer["ok"] is False
        assert answer["error"]["type"] in ("BadRequest", "NotFound", "Conflict")
        assert message in answer["error"]["message"] and "\n" not in answer["error"]["message"]
        assert "Traceback" not in json.dumps(answer)
        assert jobs.scheduler.requests == []  # never acted on


def test_a_lost_run_task_answer_never_starts_a_second_task(jobs: JobsWorld):
    """RunTask started the task but its answer was lost: the record fails, SQS delivers it again, and
    the repeated RunTask carries the same client token, so ECS answers with the same task."""
    job = jobs.submit(gpus=1)
    arn1 = job["task_arn"]
    jobs.emit(arn1)
    jobs.scheduler.lose_answers = 1
    jobs.stop(arn1, "SpotGuard: spot-interruption x on i-0123456789abcdef0")
    jobs.put(jobs.event(arn1, exit_code=75))
    assert jobs.task_events.drain() == (1, 1)  # delivered, failed
    assert jobs.status(job["job_id"])["state"] == "launching"
    for receipt in jobs.task_events.failed_receipts:  # the visibility timeout passes
        jobs.task_events.sqs.change_message_visibility(
            QueueUrl=jobs.task_events.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
        )
    assert jobs.task_events.drain() == (1, 0)
    _, second, third = jobs.scheduler.requests
    assert second["clientToken"] == third["clientToken"]
    status = jobs.status(job["job_id"])
    assert status["state"] == "running" and len(status["attempts"]) == 2
    assert len(set(jobs.scheduler.by_token.values())) == 2  # two tasks in all: one per attempt


def test_reconcile_applies_a_stop_whose_event_was_lost(jobs: JobsWorld):
    job = jobs.submit(gpus=4)
    arn = job["task_arn"]
    jobs.emit(arn)
    jobs.stop(arn, "SpotGuard: spot-interruption lost on i-0123456789abcdef0", exit_code=75)  # no event
    assert jobs.reconcile()["stops_applied"] == 1
    status = jobs.status(job["job_id"])
    assert status["state"] == "running" and len(status["attempts"]) == 2
    # attempt 2 runs in ECS and its RUNNING event was never sent here: taken from ECS, once
    assert jobs.reconcile() == {**SweepCounts().answer(), "checked": 1, "runs_applied": 1}
    # the cluster has no capacity providers: no pools, and jobs are placed as requested
    assert jobs.reconcile() == {**SweepCounts().answer(), "checked": 1}


def test_reconcile_resumes_a_job_whose_task_vanished_from_ecs(jobs: JobsWorld):
    from moto.ecs.models import ecs_backends

    job = jobs.submit(gpus=1)
    arn = job["task_arn"]
    ecs_backends["123456789012"]["us-east-1"].tasks["gpu-spot"].pop(arn)  # ECS forgot it
    assert jobs.reconcile()["vanished"] == 1
    first, second = jobs.status(job["job_id"])["attempts"]
    assert first["outcome"] == "resubmit" and "vanished" in first["outcome_reason"]
    assert second["number"] == 2


def test_reconcile_finishes_a_launch_left_half_done(jobs: JobsWorld):
    jobs.scheduler.lose_answers = 1
    td = jobs.cluster.gpu_task_definition(gpus=1)
    answer = jobs.invoke(
        {"action": "submit", "job_id": "half", "request": {"cluster": "gpu-spot", "taskDefinition": td}}
    )
    assert answer["error"]["type"] == "InternalError"  # the RunTask answer was lost
    assert jobs.status("half")["state"] == "launching"
    assert jobs.reconcile()["relaunched"] == 0  # not stuck yet: a launch may still be under way
    jobs.shift_clock(600)
    assert jobs.reconcile()["relaunched"] == 1
    assert jobs.status("half")["state"] == "running"
    assert len(jobs.scheduler.requests) == 2 and len(set(jobs.scheduler.by_token.values())) == 1


def _task_events_dead_letters(jobs: JobsWorld) -> list[dict]:
    sqs = jobs.stack.client("sqs")
    url = jobs.stack.outputs["TaskEventsDeadLetterQueueUrl"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
    return got.get("Messages", [])


@pytest.mark.parametrize("exit_code", ["abc", 7.5, {"code": 1}, True])
def test_a_malformed_task_event_poisons_no_job(jobs: JobsWorld, exit_code):
    """A container exitCode that is not an integer used to be copied into the job: after it, status and
    list failed for that job and every reconcile run raised. Now the event is rejected at the door."""
    job = jobs.submit(gpus=1)
    arn = job["task_arn"]
    running = jobs.emit(arn)
    bad = json.loads(json.dumps(running))
    bad["id"] = "bad-exit-code"
    bad["detail"].update(
        version=running["detail"]["version"] + 1, lastStatus="STOPPED", desiredStatus="STOPPED"
    )
    bad["detail"]["containers"][0]["exitCode"] = exit_code
    jobs.put(bad)
    jobs.task_events.drain()
    (dead,) = _task_events_dead_letters(jobs)
    reason = dead["MessageAttributes"]["spotguard-reject-reason"]["StringValue"]
    assert "exitCode" in reason and "\n" not in reason
    assert jobs.status(job["job_id"])["state"] == "running"
    assert [j["job_id"] for j in jobs.invoke({"action": "list"})["jobs"]] == [job["job_id"]]
    assert jobs.reconcile()["checked"] == 1


def test_a_job_that_cannot_be_read_is_skipped_by_list_and_reconcile_and_named_by_status(jobs: JobsWorld):
    """A ledger item that no longer parses (written by hand, or by an older version with a bug) is
    isolated: list and reconcile go on with every other job, status says which job and why."""
    good, bad = jobs.submit(gpus=1), jobs.submit(gpus=1)
    for j in (good, bad):
        jobs.emit(j["task_arn"])
    ddb = jobs.stack.client("dynamodb")
    table = jobs.stack.functions["JobsFunction"].environment["SPOTGUARD_LEDGER_TABLE"]
    key = {"pk": {"S": f"JOB#{bad['job_id']}"}, "sk": {"S": "JOB"}}
    item = ddb.get_item(TableName=table, Key=key)["Item"]
    doc = json.loads(item["doc"]["S"])
    doc["attempts"][0]["exit_codes"] = {"train": "abc"}
    item["doc"] = {"S": json.dumps(doc)}
    ddb.put_item(TableName=table, Item=item)

    listed = jobs.invoke({"action": "list"})
    assert listed["ok"] and [j["job_id"] for j in listed["jobs"]] == [good["job_id"]]
    jobs.stop(good["task_arn"], "SpotGuard: spot-interruption lost on i-0123456789abcdef0", exit_code=75)
    counts = jobs.reconcile()
    assert counts["stops_applied"] == 1 and counts["unreadable"] == 1
    answer = jobs.invoke({"action": "status", "job_id": bad["job_id"]})
    assert answer["ok"] is False and answer["error"]["type"] == "Unreadable"
    assert bad["job_id"] in answer["error"]["message"] and "exit_codes" in answer["error"]["message"]
    # an event for it is dead-lettered once with the reason, not retried: no retry can mend the item
    jobs.emit(bad["task_arn"])
    (dead,) = _task_events_dead_letters(jobs)
    assert "cannot be read" in dead["MessageAttributes"]["spotguard-reject-reason"]["StringValue"]


def test_submit_refuses_a_role_or_family_the_stack_may_not_use(aws):
    """iam:PassRole was on *, and a submit could override taskRoleArn: any command as any role. Now the
    stack passes only its TaskRoleArns and runs only its TaskDefinitionFamilies, and submit says so."""
    world = make_jobs_world(
        env={
            "SPOTGUARD_PASS_ROLES": "arn:aws:iam::*:role/spotguard-*",
            "SPOTGUARD_TASK_FAMILIES": "gpu-train-1gpu",
        }
    )

    def submit(family: str, overrides: dict | None = None) -> dict:
        td = world.cluster.gpu_task_definition(family=family, gpus=1)
        request = {"cluster": "gpu-spot", "taskDefinition": td, "launchType": "EC2"}
        if overrides:
            request["overrides"] = overrides
        return world.invoke({"action": "submit", "request": request})

    other = submit("crypto-miner")
    assert (
        other["ok"] is False
        and "family 'crypto-miner-1gpu' is not one this stack runs" in other["error"]["message"]
    )
    admin = submit("gpu-train", {"taskRoleArn": "arn:aws:iam::123456789012:role/admin"})
    assert admin["ok"] is False and admin["error"]["type"] == "BadRequest"
    assert "request.overrides.taskRoleArn: arn:aws:iam::123456789012:role/admin" in admin["error"]["message"]
    assert world.scheduler.requests == []
    ours = submit("gpu-train", {"taskRoleArn": "arn:aws:iam::123456789012:role/spotguard-train"})
    assert ours["ok"] is True and len(world.scheduler.requests) == 1


@pytest.mark.parametrize(
    ("overrides", "wrong"),
    [
        ({"containerOverrides": [{"name": "train", "command": {"n": 1}}]}, "containerOverrides[0].command"),
        # not a list at all: the task definition's reading (GPUs asked for) broke on it, an InternalError
        ({"containerOverrides": {"n": ["leaf"]}}, "containerOverrides,"),
        ({"containerOverrides": ["train"]}, "containerOverrides[0],"),
    ],
    ids=["command-not-a-list", "overrides-not-a-list", "override-not-an-object"],
)
def test_a_request_ecs_would_refuse_is_refused_at_submit_not_at_launch(jobs: JobsWorld, overrides, wrong):
    """The request's overrides are free-form: a shape RunTask refuses (a command that is not a list)
    passed submit, and botocore's validation then failed every launch of the job (the property suite
    found it). It is checked against ECS's API model at submit, before the task definition is read with
    the overrides (containerOverrides that were no list made that reading fail: the property suite
    found it again, as an InternalError)."""
    td = jobs.cluster.gpu_task_definition(gpus=1)
    answer = jobs.invoke(
        {
            "action": "submit",
            "request": {
                "cluster": "gpu-spot",
                "taskDefinition": td,
                "launchType": "EC2",
                "overrides": overrides,
            },
        }
    )
    assert answer["ok"] is False and answer["error"]["type"] == "BadRequest", answer
    assert answer["error"]["message"].startswith(f"request: Invalid type for parameter overrides.{wrong}")
    assert jobs.scheduler.requests == [] and jobs.invoke({"action": "list"})["jobs"] == []


@pytest.mark.parametrize(
    "failure",
    [
        ClientError(
            {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "DescribeTaskDefinition"
        ),
        ClientError(
            {"Error": {"Code": "ServerException", "Message": "Service unavailable"}}, "DescribeTaskDefinition"
        ),
        ReadTimeoutError(endpoint_url="https://ecs.us-east-1.amazonaws.com"),
    ],
    ids=["throttled", "5xx", "answer-lost"],
)
def test_a_task_definition_ecs_could_not_describe_for_now_is_no_bad_request(jobs: JobsWorld, failure):
    """The soak under faults (spotguard local soak --faults 0.05 --seed 5) saw a submit answered
    BadRequest "request.taskDefinition: Read timeout on endpoint URL": any error of DescribeTaskDefinition
    was taken for a wrong name, so a user (or a CLI that retries what may succeed) gave up on a good job.
    A throttle, a server error or a lost answer is now an InternalError, and the same submit again makes
    the job; a name ECS refuses is still a BadRequest."""
    td = jobs.cluster.gpu_task_definition(gpus=1)
    failing = [True]

    def describe(**_):
        if failing[0]:
            raise failure

    clients.on_event("before-call.ecs.DescribeTaskDefinition", describe)
    payload = {
        "action": "submit",
        "job_id": "td-for-now",
        "request": {"cluster": "gpu-spot", "taskDefinition": td, "launchType": "EC2"},
    }
    answer = jobs.invoke(payload)
    assert answer["ok"] is False and answer["error"]["type"] == "InternalError", answer
    failing[0] = False
    answer = jobs.invoke(payload)
    assert answer["ok"] is True and answer["job"]["job_id"] == "td-for-now"
    unknown = jobs.invoke(
        {**payload, "job_id": "td-unknown", "request": {**payload["request"], "taskDefinition": "nope:9"}}
    )
    assert unknown["ok"] is False and unknown["error"]["type"] == "BadRequest"


def test_a_cluster_reconcile_cannot_describe_stops_no_sweep(jobs: JobsWorld, monkeypatch):
    """A watched cluster deleted, or no longer the stack's to read: its DescribeTasks fails, and the
    sweep counts its jobs as failed and goes on (it aborted the whole sweep, every run)."""
    job = jobs.submit(gpus=1)
    jobs.emit(job["task_arn"])
    ecs = jobs.reconcile_fn.module.runtime.service.ecs

    def gone(cluster, arns):
        raise RuntimeError(f"ClusterNotFoundException: {cluster}")

    monkeypatch.setattr(ecs, "describe_many", gone)
    counts = jobs.reconcile()
    assert counts["failed"] == 1 and counts["checked"] == 1


def test_submit_refuses_a_volume_configured_with_the_stacks_own_ebs_role(jobs: JobsWorld):
    """The stack may pass its EBS role to ECS, for EBS mode: a request that configures a volume of its
    own with that role could have any snapshot restored into its task."""
    stack_role = jobs.jobs_fn.module.runtime.service.config.ebs_role_arn
    assert stack_role
    td = jobs.cluster.gpu_task_definition(gpus=1)
    volume = {
        "name": "data",
        "managedEBSVolume": {"roleArn": stack_role, "snapshotId": "snap-0123456789abcdef0"},
    }
    answer = jobs.invoke(
        {
            "action": "submit",
            "request": {"cluster": "gpu-spot", "taskDefinition": td, "volumeConfigurations": [volume]},
            "options": {"checkpoint_mode": "s3"},
        }
    )
    assert answer["ok"] is False and "the stack's own EBS role" in answer["error"]["message"]
    assert jobs.scheduler.requests == []
