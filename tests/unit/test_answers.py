"""The jobs function's answers, typed (domain/jobs/answers.py) and on the wire as they have always been:
a job's empty fields null, never left out; times with their offset; nothing empty at the top."""

from __future__ import annotations

from datetime import UTC, datetime

from spotguard.domain.jobs.answers import JobStatus, JobSummary
from spotguard.domain.jobs.commands import Answer, ErrorBody
from tests.unit.test_job_engine import _job

NOW = datetime(2026, 11, 22, 12, 30, tzinfo=UTC)


def test_a_summary_on_the_wire_keeps_its_nulls_and_its_times_offset():
    wire = Answer(ok=True, action="cancel", job=JobSummary.of(_job())).wire()
    assert set(wire) == {"ok", "action", "job"}  # no error, no jobs: left out at the top
    job = wire["job"]
    assert job["task_arn"] is None and job["retry_at"] is None and job["decision"] is None
    assert job["attempts"] == 0 and job["state"] == "queued" and job["finished"] is False
    assert job["created_at"].endswith("+00:00")  # isoformat, not pydantic's "Z"
    assert datetime.fromisoformat(job["created_at"]) == _job().created_at


def test_a_status_is_the_summary_and_the_job_s_records():
    status = JobStatus.of(_job(), [], NOW)
    wire = Answer(ok=True, action="status", job=status).wire()["job"]
    assert wire["attempts"] == [] and wire["checkpoints"] == [] and wire["move"] is None
    assert wire["request"]["cluster"]  # the job's own records, as they dump
    assert set(JobSummary.model_fields) - {"attempts"} <= set(wire)
    assert {"request", "options", "spend", "decisions", "moves_made", "avoiding"} <= set(wire)


def test_an_answer_read_back_from_the_wire_is_the_same_answer():
    sent = Answer(ok=True, action="list", jobs=[JobSummary.of(_job())])
    assert Answer.model_validate(sent.wire()) == sent
    refused = Answer(ok=False, action="submit", error=ErrorBody(type="BadRequest", message="x"))
    assert refused.wire() == {
        "ok": False,
        "action": "submit",
        "error": {"type": "BadRequest", "message": "x"},
    }
