"""`spotguard jobs`: arguments to a validated payload, the function found from the stack, tables."""

from __future__ import annotations

import io
import json
from pathlib import Path

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from spotguard_cli import jobs as jobs_cli
from spotguard_cli.emulator.world import JobsWorld
from spotguard_cli.main import build_parser


def _run(world: JobsWorld | None, *argv: str) -> tuple[int, str]:
    args = build_parser().parse_args(["jobs", *argv])
    out = io.StringIO()
    invoke = world.invoke if world is not None else None
    return jobs_cli.run(args, invoke=invoke, out=out), out.getvalue()


@pytest.mark.slow  # deploys the stack into moto
def test_submit_status_list_and_cancel_from_the_command_line(jobs: JobsWorld):
    td = jobs.cluster.gpu_task_definition(gpus=4)
    code, out = _run(
        jobs, "submit", "--cluster", "gpu-spot", "--task-definition", td, "--launch-type", "EC2",
        "--job-id", "cli-job", "--max-attempts", "5",
    )  # fmt: skip
    assert code == 0 and out.startswith("job cli-job: running  (4 GPU, 1 attempt(s))")
    (request,) = jobs.scheduler.requests
    assert request["taskDefinition"] == td

    code, out = _run(jobs, "status", "cli-job")
    assert code == 0
    assert "#  TASK" in out and "running" in out.splitlines()[0]

    code, out = _run(jobs, "--json", "list", "--state", "running")
    assert code == 0 and [j["job_id"] for j in json.loads(out)["jobs"]] == ["cli-job"]

    code, out = _run(jobs, "cancel", "cli-job")
    assert code == 0
    code, out = _run(jobs, "list")
    assert "cli-job" in out and "JOB" in out.splitlines()[0]


@pytest.mark.slow  # deploys the stack into moto
def test_a_name_used_by_a_job_that_ended_says_how_to_run_it_again(jobs: JobsWorld, capsys):
    """Issue 45, item 20: a cancelled job's name could not be reused, and nothing said how."""
    td = jobs.cluster.gpu_task_definition(gpus=4)
    submit = [
        "submit",
        "--cluster",
        "gpu-spot",
        "--task-definition",
        td,
        "--launch-type",
        "EC2",
        "--job-id",
        "j9",
    ]
    assert _run(jobs, *submit)[0] == 0
    arn = jobs.status("j9")["attempts"][0]["task_arn"]
    jobs.emit(arn)  # RUNNING
    assert _run(jobs, "cancel", "j9")[0] == 0
    jobs.emit(arn, exit_code=143)
    st = jobs.status("j9")
    assert st["state"] == "cancelled", (st["state"], st["last_reason"], jobs.task(arn)["lastStatus"])
    capsys.readouterr()
    # the same submit again (after the jobs function's idempotency window): the job it made, ended
    (summary,) = [j for j in jobs.invoke({"action": "list"})["jobs"] if j["job_id"] == "j9"]
    args = build_parser().parse_args(["jobs", *submit])
    code = jobs_cli.run(
        args, invoke=lambda _: {"ok": True, "action": "submit", "job": summary}, out=io.StringIO()
    )
    err = capsys.readouterr().err
    assert code == 0 and "job j9 exists and has cancelled: nothing started" in err
    assert "`spotguard jobs resubmit j9` runs it again" in err
    code, _ = _run(jobs, *submit, "--max-attempts", "3")  # another request under that name
    err = capsys.readouterr().err
    assert code == 1 and "exists already (cancelled) with another request or options" in err
    assert "give the job another name; `spotguard jobs resubmit j9` runs it again as it was" in err


@pytest.mark.slow  # deploys the stack into moto
def test_a_request_file_and_a_refusal(jobs: JobsWorld, tmp_path: Path, capsys):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"cluster": "other", "taskDefinition": "t:1"}))
    code, _ = _run(jobs, "submit", "--request", str(request))
    assert code == 1
    assert "BadRequest: request.cluster: other is not a watched cluster" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit"], "give --request FILE, or --cluster and --task-definition"),
        (["submit", "--request", "{not json"], "not valid JSON"),
        (
            ["submit", "--cluster", "c", "--task-definition", "t", "--max-attempts", "0"],
            "options.max_attempts",
        ),
        (
            ["submit", "--cluster", "c", "--task-definition", "t", "--deadline", "tomorrow"],
            "options.deadline",
        ),
        (["status", "bad/id"], "job_id"),
        (
            ["submit", "--cluster", "c", "--task-definition", "t", "--security-groups", "sg-1"],
            "needs --subnets",
        ),
        (["resubmit", "arn:aws:ecs:us-east-1:123456789012:service/x"], "task_arn"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_invoked(argv, message, capsys):
    code, _ = _run(None, *argv)  # no invoker: reaching it would fail the test
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


@pytest.mark.slow  # deploys the stack into moto
def test_the_function_is_found_from_the_stack_and_invoked(jobs: JobsWorld, monkeypatch, tmp_path: Path):
    (tmp_path / "samconfig.toml").write_text('[default.global.parameters]\nstack_name = "spotguard"\n')
    monkeypatch.chdir(tmp_path)
    assert jobs_cli.stack_name(None) == "spotguard" and jobs_cli.stack_name("mine") == "mine"
    function = jobs.jobs_fn.fn.name
    real_client = boto3.session.Session.client
    stubbers = []

    def client(self, service, *a, **kw):
        c = real_client(self, service, *a, **kw)
        if service == "lambda":  # moto runs Lambda code only in Docker: answer as the function would
            stub = Stubber(c)
            body = json.dumps({"ok": True, "action": "list", "jobs": []}).encode()
            stub.add_response(
                "invoke",
                {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(body), len(body))},
                {"FunctionName": function, "Payload": json.dumps({"action": "list", "limit": 50}).encode()},
            )
            stub.activate()
            stubbers.append(stub)
        return c

    monkeypatch.setattr(boto3.session.Session, "client", client)
    args = build_parser().parse_args(["jobs", "--region", "us-east-1", "list"])
    out = io.StringIO()
    assert jobs_cli.run(args, out=out) == 0
    assert out.getvalue().strip() == "no jobs"
    stubbers[0].assert_no_pending_responses()


def test_an_awsvpc_task_gets_its_network_from_the_flags():
    args = build_parser().parse_args(
        ["jobs", "submit", "--cluster", "gpu-spot", "--task-definition", "train-1gpu",
         "--subnets", "subnet-0aaa, subnet-0bbb", "--security-groups", "sg-0123"]
    )  # fmt: skip
    assert jobs_cli.payload(args)["request"]["networkConfiguration"] == {
        "awsvpcConfiguration": {
            "subnets": ["subnet-0aaa", "subnet-0bbb"],
            "assignPublicIp": "DISABLED",
            "securityGroups": ["sg-0123"],
        }
    }
