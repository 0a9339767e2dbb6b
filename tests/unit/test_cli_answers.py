"""The CLI reads the jobs function's answers into typed views (spotguard_cli/answers.py): the answer the
function gives today, one from a newer stack (fields it does not know), one from an older stack (fields
missing), and one it cannot read (said in one line, never a traceback)."""

from __future__ import annotations

import copy
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.jobs.answers import JobStatus, JobSummary
from spotguard.domain.jobs.commands import Answer, ErrorBody
from spotguard.domain.jobs.model import Attempt, JobState, NodeTask
from spotguard.domain.jobs.placement import Move
from spotguard.domain.jobs.spend import Spend
from spotguard.domain.jobs.submission import JobOptions, RunTaskRequest
from spotguard_cli import jobs as jobs_cli
from spotguard_cli.answers import (
    AnswerError,
    AttemptView,
    CheckpointView,
    DecisionView,
    MoveView,
    NodeView,
    OptionsView,
    RequestView,
    StatusAnswer,
    StatusView,
    SummaryAnswer,
    SummaryView,
    read_answer,
    read_status,
)
from spotguard_cli.clock import FakeClock
from spotguard_cli.main import build_parser
from tests.unit.test_job_engine import TASK, _job

NOW = datetime(2026, 11, 22, 14, 0, tzinfo=UTC)
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
POOL = "gpu-spot/g5.xlarge/us-east-1a"


def _decision(at: datetime, placement: str = "spot") -> PlacementDecision:
    return PlacementDecision(
        at=at, placement=placement, pool=POOL, reason="cheapest pool with spot", expected_cost=3.5
    )


def _status_wire() -> dict[str, Any]:
    """A status as the function gives it (through JSON): an interrupted attempt, a live one being moved,
    a checkpoint, two decisions, a deadline."""
    first = Attempt(
        number=1,
        task_arn=f"{TASK}aaaa",
        launched_at=T0,
        started_at=T0 + timedelta(minutes=5),
        stopped_at=T0 + timedelta(minutes=50),
        last_status="STOPPED",
        instance_type="g5.xlarge",
        availability_zone="us-east-1a",
        lifecycle="spot",
        price_per_hour=0.4,
        exit_codes={"train": 143},
        outcome="resubmit",
        interrupted_by="spot-interruption#evt-1#i-0abc",
        pool=POOL,
        market="spot",
    )
    ref = CheckpointRef(
        prefix_uri="s3://bucket/jobs/j1/",
        sequence=2,
        manifest_uri="s3://bucket/jobs/j1/checkpoints/00000002/MANIFEST.json",
        step=200,
        progress=0.2,
        attempt=1,
        job_id="j1",
        created_at=T0 + timedelta(minutes=40),
    )
    second = Attempt(
        number=2,
        task_arn=f"{TASK}bbbb",
        launched_at=T0 + timedelta(minutes=51),
        started_at=T0 + timedelta(minutes=55),
        last_status="RUNNING",
        resume_from=ref.manifest_uri,
        market="on-demand",
        price_per_hour=1.2,
    )
    job = _job(
        state=JobState.RUNNING,
        options=JobOptions(deadline=T0 + timedelta(hours=8)),
        attempts=[first, second],
        decisions=[_decision(T0), _decision(T0 + timedelta(minutes=51), "on-demand")],
        move=Move(attempt=2, to=_decision(NOW), requested_at=NOW - timedelta(minutes=1)),
        moves_made=1,
    )
    answer = Answer(ok=True, action="status", job=JobStatus.of(job, [ref], NOW))
    return json.loads(json.dumps(answer.wire()))


def test_todays_status_answer_is_read_whole():
    wire = _status_wire()
    read = read_answer(json.dumps(wire))
    assert isinstance(read, StatusAnswer) and read.ok and read.action == "status"
    job = read.status()
    assert (job.job_id, job.state, job.gpus, job.task_arn) == ("j1", "running", 1, f"{TASK}bbbb")
    assert job.request == RequestView(cluster=_job().request.cluster, taskDefinition="train-1gpu:1")
    assert job.options.deadline == T0 + timedelta(hours=8)
    first, second = job.attempts
    assert first.number == 1 and first.started_at == T0 + timedelta(minutes=5) and not first.live
    assert first.exit_codes == {"train": 143} and first.interrupted_by == "spot-interruption#evt-1#i-0abc"
    assert second.live and second.resume_from == job.checkpoints[0].manifest_uri
    assert second.market == "on-demand" and second.stopped_at is None
    (ref,) = job.checkpoints
    assert (ref.sequence, ref.step, ref.progress, ref.attempt) == (2, 200, 0.2, 1)
    assert [d.placement for d in job.decisions] == ["spot", "on-demand"] and job.decisions[0].at == T0
    assert job.move is not None and job.move.attempt == 2 and job.move.to.pool == POOL
    assert job.moves_made == 1 and job.spend == Spend(**wire["job"]["spend"]) and job.spend.dollars


def test_todays_summaries_and_list_are_read():
    summary = JobSummary.of(_job(attempts=[]))
    cancel = read_answer(Answer(ok=True, action="cancel", job=summary).wire())
    assert isinstance(cancel, SummaryAnswer) and isinstance(cancel.job, SummaryView)
    assert (cancel.job.job_id, cancel.job.state, cancel.job.attempts) == ("j1", "queued", 0)
    assert cancel.job.updated_at == T0 and cancel.job.retry_at is None
    listed = read_answer(Answer(ok=True, action="list", jobs=[summary, summary]).wire())
    assert listed.jobs is not None and [j.job_id for j in listed.jobs] == ["j1", "j1"]


def test_a_refusal_is_read_and_asking_it_for_a_status_says_the_error():
    wire = Answer(ok=False, action="status", error=ErrorBody(type="NotFound", message="no job j9")).wire()
    read = read_answer(wire)
    assert not read.ok and read.error_line() == "NotFound: no job j9"
    with pytest.raises(AnswerError, match=r"^NotFound: no job j9$"):
        read.status()


def _with_extras(value: Any) -> Any:
    """Every object of the answer with a field no view knows (a newer stack's); not the exit codes, a
    map of the task's containers."""
    if isinstance(value, dict):
        fields = {k: v if k == "exit_codes" else _with_extras(v) for k, v in value.items()}
        return {**fields, "added_in_v9": {"x": [1]}}
    if isinstance(value, list):
        return [_with_extras(v) for v in value]
    return value


def test_a_newer_stacks_fields_are_ignored():
    wire = _status_wire()
    newer = _with_extras(wire)
    assert newer["job"]["attempts"][0]["added_in_v9"] and newer["job"]["spend"]["added_in_v9"]
    assert read_answer(newer) == read_answer(wire)
    refusal = _with_extras({"ok": False, "error": {"type": "Conflict", "message": "busy"}})
    assert read_answer(refusal).error_line() == "Conflict: busy"


def test_an_older_stacks_missing_fields_take_defaults_and_still_render():
    older = _status_wire()
    job = older["job"]
    for key in ("decisions", "move", "moves_made", "spend", "snapshots", "options", "retry_at"):
        del job[key]
    for a in job["attempts"]:
        for key in ("market", "pool", "exit_codes", "launched_at"):
            a.pop(key, None)
    del job["checkpoints"][0]["created_at"]
    status = read_answer(older).status()
    assert status.decisions == [] and status.move is None and status.moves_made == 0
    assert status.spend is None and status.options == OptionsView() and status.options.deadline is None
    assert status.attempts[0].market is None and status.attempts[0].exit_codes == {}
    assert status.checkpoints[0].created_at is None
    text = jobs_cli.render(older)
    assert text.splitlines()[0] == "job j1: running  (1 GPU, 2 attempt(s))"
    assert "capacity decisions" not in text and "spent" not in text


def test_a_time_without_a_zone_is_read_as_utc():
    a = AttemptView.model_validate({"number": 1, "started_at": "2026-11-22T12:05:00"})
    assert a.started_at == T0 + timedelta(minutes=5)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("{not json", "the jobs function's answer is not JSON"),
        ([1, 2], "not a JSON object but list"),
        ({"job": {"job_id": "j1"}}, "ok: Field required"),
        ({"ok": True}, "neither a job nor jobs"),
        ({"ok": True, "job": {"job_id": "j1", "gpus": "many", "attempts": 1}}, "job.gpus: "),
        ({"ok": True, "job": {"attempts": [{"number": "first"}]}}, "job.attempts.0.number: "),
        ({"ok": True, "job": {"attempts": [], "updated_at": "yesterday"}}, "job.updated_at: expected an ISO"),
        ({"ok": True, "jobs": [{"job_id": 7}]}, "jobs.0.job_id: "),
        ({"ok": False, "error": "boom"}, "error: "),
    ],
)
def test_an_answer_that_cannot_be_read_is_one_line(raw, said):
    with pytest.raises(AnswerError) as caught:
        read_answer(raw if isinstance(raw, str) else copy.deepcopy(raw))
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_read_status_takes_the_answer_or_its_job_and_refuses_what_is_no_status():
    wire = _status_wire()
    assert read_status(wire) == read_status(wire["job"]) == read_answer(wire).status()
    with pytest.raises(AnswerError, match="not a jobs status answer"):
        read_status({"ok": True, "job": {"job_id": "j1", "attempts": 2}})


@pytest.mark.parametrize("argv", [["status", "j1"], ["status", "j1", "--watch"], ["logs", "j1"]])
def test_the_cli_says_an_unreadable_answer_in_one_line_exit_1(argv, capsys):
    def invoke(body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "action": "status", "job": {"job_id": "j1", "gpus": "many", "attempts": []}}

    args = build_parser().parse_args(["jobs", *argv])
    assert jobs_cli.run(args, invoke=invoke, out=io.StringIO(), clock=FakeClock(NOW)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"spotguard jobs {argv[0]}: the jobs function's answer cannot be read: job.gpus: ")


# Every field a view reads is one the function sends: named as the function's models name it.
VIEWS = [
    (SummaryView, set(JobSummary.model_fields)),
    (StatusView, set(JobStatus.model_fields)),
    (AttemptView, set(Attempt.model_fields)),
    (NodeView, set(NodeTask.model_fields)),
    (CheckpointView, set(CheckpointRef.model_fields)),
    (DecisionView, set(PlacementDecision.model_fields)),
    (MoveView, set(Move.model_fields)),
    (RequestView, set(RunTaskRequest.model_fields)),
    (OptionsView, set(JobOptions.model_fields)),
]


@pytest.mark.parametrize(("view", "sent"), VIEWS, ids=[v.__name__ for v, _ in VIEWS])
def test_every_field_a_view_reads_is_one_the_function_sends(view, sent):
    assert set(view.model_fields) <= sent
    assert view.model_config.get("extra") == "ignore"
    view()  # every field has a default: an older stack's answer without it is read
