"""What a new user trips on (issue 29): every bad argument is one line naming the flag and what it
expects, refused before any work starts; the documented commands work as written; what the demos print
reads well. Nothing here starts moto server or a demo: the checks that refuse come first, and the
rendering is tested on fixed inputs."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from spotguard.domain.jobs.commands import parse_command
from spotguard.usecases.jobs.sweep import SweepCounts
from spotguard_cli import jobs as jobs_cli
from spotguard_cli.local import demo as localcmd
from spotguard_cli.local import shared, up
from spotguard_cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI; it must refuse with exit status 2 and one line on stderr, printing nothing else."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses it before the command runs
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and out == "", (out, err)
    return err.rstrip("\n")


@pytest.fixture
def no_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A demo that got past its checks would start moto server: fail at once instead."""

    def started(*_: Any) -> int:
        raise AssertionError("the demo started: its arguments should have been refused")

    monkeypatch.setattr(localcmd, "_run_demo", started)


# ------------------------------------------------------------------------------------ argument types
@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["local", "inject", "capacity-shortage", "--for", "abc"],
            "spotguard local inject: argument --for: 'abc' is not a number of seconds",
        ),
        (
            ["local", "inject", "capacity-shortage", "--for", "0"],
            "spotguard local inject: argument --for: must be a number of seconds > 0 and at most 100000, "
            "not 0",
        ),
        (
            ["local", "demo", "--step-seconds", "abc"],
            "spotguard local demo: argument --step-seconds: 'abc' is not a number of seconds",
        ),
        (
            ["local", "demo", "--steps", "1.5"],
            "spotguard local demo: argument --steps: '1.5' is not a whole number",
        ),
        (
            ["local", "up", "--instances", "many"],
            "spotguard local up: argument --instances: 'many' is not a whole number",
        ),
        (
            ["jobs", "submit", "--cluster", "c", "--task-definition", "t", "--max-attempts", "x"],
            "spotguard jobs submit: argument --max-attempts: 'x' is not a whole number",
        ),
        (
            ["local"],
            "spotguard local: the following arguments are required: ACTION (see spotguard local --help)",
        ),
    ],
)
def test_bad_arguments_name_the_flag_and_what_it_expects(argv, line, capsys, no_demo):
    assert _refused(argv, capsys) == line


def test_no_argument_error_shows_an_internal_name(capsys, no_demo):
    for argv in (
        ["local", "inject", "capacity-shortage", "--for", "abc"],
        ["local", "demo", "--step-seconds", "abc"],
        ["local", "demo", "--time-scale", "abc"],
        ["simulate", "--policy", "greedy", "--trace", "t", "--job-hours", "abc"],
    ):
        assert "invalid _" not in _refused(argv, capsys)


# ----------------------------------------------------------------------------------- local demo args
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--steps", "10", "--interrupt-at", "20"],
            "argument --interrupt-at: the job's steps are 0 to 9 (--steps 10) and one must follow the "
            "warning: a step from 0 to 8, not 20",
        ),
        (
            ["--interrupt-at", "-1"],
            "argument --interrupt-at: must be a whole number from 0 to 100000, not -1",
        ),
        (["--steps", "10"], "not 25 (the default; give --interrupt-at 0 to 8)"),
        (["--steps", "1"], "argument --steps: the warning needs a step before it and one after"),
        (["--time-scale", "5"], "argument --time-scale: is for --scenario capacity"),
        (["--scenario", "capacity", "--interrupt-at", "3"], "argument --interrupt-at: is for --scenario"),
        (["--scenario", "capacity", "--steps", "4"], "argument --steps: the capacity scenario warns"),
    ],
)
def test_an_impossible_demo_is_refused_at_once(argv, message, capsys, no_demo):
    line = _refused(["local", "demo", *argv], capsys)
    assert line.startswith("spotguard local demo: ") and message in line


def test_a_possible_demo_gets_its_defaults():
    args = build_parser().parse_args(["local", "demo", "--steps", "30", "--interrupt-at", "10"])
    assert localcmd.demo_arguments(args) is None
    assert (args.steps, args.interrupt_at, args.step_seconds) == (30, 10, 0.1)
    capacity = build_parser().parse_args(["local", "demo", "--scenario", "capacity"])
    assert localcmd.demo_arguments(capacity) is None
    assert (capacity.steps, capacity.step_seconds, capacity.time_scale) == (300, 0.4, 60.0)


def test_a_demo_that_goes_wrong_ends_in_one_line_not_a_traceback(monkeypatch, capsys):
    def wrong(*_: Any) -> int:
        raise RuntimeError("the job did not reach step 20; see .local-stack/demo/task-1.log")

    monkeypatch.setattr(localcmd, "_run_demo", wrong)
    assert main(["local", "demo"]) == 1
    out, err = capsys.readouterr()
    assert err == "spotguard local demo: the job did not reach step 20; see .local-stack/demo/task-1.log\n"
    assert out.endswith("demo FAILED\n")


# ------------------------------------------------------------------------------------------- simulate
SIMULATE = [
    "--job-hours",
    "1",
    "--deadline-hours",
    "2",
    "--restart-hours",
    "0",
    "--samples",
    "1",
    "--seed",
    "1",
]


def test_simulate_checks_the_plot_path_before_the_sweep(tmp_path, capsys):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": [1] * 10}))
    argv = ["simulate", "--policy", "greedy", "--trace", str(trace), *SIMULATE]
    line = _refused([*argv, "--plot", "/nonexistent/dir/x.png"], capsys)  # no table printed first
    assert line == "spotguard simulate: argument --plot: no such directory: /nonexistent/dir"
    line = _refused([*argv, "--plot", str(tmp_path / "x.txt")], capsys)
    assert line.startswith("spotguard simulate: argument --plot: the file's name ends in .png, .svg, .pdf")


def test_simulate_on_a_trace_never_fetched_says_make_traces(tmp_path, capsys):
    missing = tmp_path / ".traces" / "cant-be-late-2022-10" / "us-west-2a_k80_1.json"
    line = _refused(["simulate", "--policy", "greedy", "--trace", str(missing), *SIMULATE], capsys)
    assert (
        line.startswith(f"spotguard simulate: {missing}: cannot read: no such file") and "make traces" in line
    )


# ----------------------------------------------------------------------------------------- jobs submit
def _documented_requests() -> list[str]:
    found = []
    for doc in ("README.md", "docs/jobs.md"):
        found += re.findall(r"spotguard jobs submit --request (\S+)", (REPO / doc).read_text())
    return found


def test_the_documented_submit_request_file_is_a_runtask_request():
    files = _documented_requests()
    assert files and all(f == "events/jobs/requests/runtask.json" for f in files), files
    for name in files:
        args = build_parser().parse_args(["jobs", "submit", "--request", str(REPO / name)])
        body = jobs_cli.payload(args)
        assert parse_command(body).action == "submit"
        assert body["request"]["cluster"] and body["request"]["taskDefinition"]


def test_a_whole_payload_given_as_the_request_says_what_to_give(capsys):
    args = build_parser().parse_args(["jobs", "submit", "--request", str(REPO / "events/jobs/submit.json")])
    assert jobs_cli.run(args, invoke=lambda body: pytest.fail("invoked"), out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "whole jobs-function payload" in err and "requests/runtask.json" in err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["submit", "--request", '{"cluster": 5}'],
            "spotguard jobs submit: request.cluster: Input should be a valid string; "
            "request.taskDefinition: Field required",
        ),
        (
            ["submit", "--cluster", "c", "--task-definition", "t", "--max-attempts", "0"],
            "spotguard jobs submit: --max-attempts (options.max_attempts): Input should be greater than or "
            "equal to 1",
        ),
        (
            ["submit", "--cluster", "c", "--task-definition", "t", "--deadline", "tomorrow"],
            "spotguard jobs submit: --deadline (options.deadline): expected an ISO 8601 time with a time "
            "zone, e.g. 2027-06-01T18:00:00Z, not 'tomorrow'",
        ),
        (
            ["submit", "--cluster", "c", "--task-definition", "t", "--deadline", "2026-12-01T18:00"],
            "spotguard jobs submit: --deadline (options.deadline): expected an ISO 8601 time with a time "
            "zone, e.g. 2027-06-01T18:00:00Z, not '2026-12-01T18:00'",
        ),
        (
            ["list", "--limit", "0"],
            "spotguard jobs list: --limit: Input should be greater than or equal to 1",
        ),
        (
            ["submit", "--request", "/no/such/request.json"],
            "spotguard jobs submit: --request: cannot read /no/such/request.json: No such file or directory",
        ),
    ],
)
def test_jobs_refusals_name_every_field_as_the_user_gave_it(argv, line, capsys):
    args = build_parser().parse_args(["jobs", *argv])
    assert jobs_cli.run(args, invoke=lambda body: pytest.fail("invoked"), out=io.StringIO()) == 2
    assert capsys.readouterr().err == line + "\n"


# ---------------------------------------------------------------------------- what the demos print
RECONCILE_QUIET = {**SweepCounts().answer(), "checked": 1, "pools": 4}


def test_a_reconcile_that_only_looked_says_nothing_and_one_that_acted_says_what_in_words():
    from spotguard_cli.emulator.timeline import reconcile_line

    assert reconcile_line(RECONCILE_QUIET) is None
    line = reconcile_line({**RECONCILE_QUIET, "moves_stopped": 1, "relaunched": 2})
    assert line == (
        "  reconcile: relaunched a stuck launch (x2); stopped a task to move it (its checkpoint committed)"
    )
    assert "{" not in line
    assert reconcile_line({**RECONCILE_QUIET, "discovery_errors": 1, "new_count": 3}) == (
        "  reconcile: could not read part of a cluster's pools; new count (x3)"
    )


CKPT_URI = "s3://spotguard-ckpt/jobs/capacity-demo/checkpoints/0000000015/MANIFEST.json"


def _runtask(provider: str, resume: str | None, attempt: int = 3) -> dict[str, Any]:
    env = [{"name": "SPOTGUARD_ATTEMPT", "value": str(attempt)}]
    if resume:
        env.append({"name": "SPOTGUARD_RESUME_FROM", "value": resume})
    return {
        "cluster": "gpu-spot",
        "capacityProviderStrategy": [{"capacityProvider": provider}],
        "overrides": {"containerOverrides": [{"name": "main", "environment": env}]},
    }


def test_each_runtask_says_where_and_a_launch_that_placed_nothing_says_why():
    from spotguard_cli.emulator.timeline import runtask_line, runtask_outcome_line

    asked = _runtask("gpu-spot-b", CKPT_URI)
    assert runtask_line(asked) == "  RunTask attempt 3 in gpu-spot-b from checkpoint 15"
    assert runtask_line(_runtask("gpu-od", None, attempt=1)) == "  RunTask attempt 1 in gpu-od from scratch"
    nothing = {"tasks": [], "failures": [{"reason": "RESOURCE:GPU"}]}
    assert runtask_outcome_line(asked, nothing) == (
        "  RunTask placed no task in gpu-spot-b: RESOURCE:GPU (no instance with a free GPU); "
        "SpotGuard places the launch again"
    )
    assert runtask_outcome_line(asked, {"tasks": [{"taskArn": "t"}], "failures": []}) is None


def test_the_signal_line_names_its_container_instead_of_stopping_mid_sentence():
    from spotguard_cli.emulator.timeline import signal_line

    task = "arn:aws:ecs:us-east-1:123456789012:task/gpu-spot/3d9955dd0123456789abcdef01234567"
    by_task = {
        "InstanceIds": ["i-209940c6585a0f616"],
        "Parameters": {"signal": ["SIGUSR1"], "containerIds": [""], "taskContainers": [f"{task}=main"]},
    }
    assert (
        signal_line(by_task)
        == "  SSM Run Command on i-209940c6585a0f616: SIGUSR1 to container main of task 3d9955dd"
    )
    by_id = {
        "InstanceIds": ["i-1"],
        "Parameters": {"signal": ["SIGTERM"], "containerIds": ["abcdef0123456789ff"]},
    }
    assert signal_line(by_id) == "  SSM Run Command on i-1: SIGTERM to container abcdef012345"


def test_a_moves_stop_reason_says_where_it_goes_once():
    from spotguard_cli.emulator.timeline import stop_line

    pool = "gpu-spot-b/g5.xlarge/us-east-1b"
    reason = (
        f"SpotGuard: moving job capacity-demo to spot in {pool}: spot in {pool}: the plan over {pool} and "
        "gpu-spot-a/g5.xlarge/us-east-1a expects it to pay best"
    )
    line = stop_line({"task": "arn:aws:ecs:us-east-1:1:task/gpu-spot/3d9955dd01", "reason": reason})
    assert line == (
        f"  StopTask 3d9955dd…  reason: SpotGuard: moving job capacity-demo to spot in {pool}: the plan over "
        f"{pool} and gpu-spot-a/g5.xlarge/us-east-1a expects it to pay best"
    )


def test_the_capacity_demos_spend_is_a_sentence_that_says_its_prices_are_placeholders():
    from spotguard_cli.local.capacity_demo import spend_line

    spend = {"gpu_hours": 2.3158, "gpu_hours_lost": 0.0418, "dollars": 0.4182, "dollars_lost": 0.0132}
    line = spend_line(spend)
    assert line == (
        "spent 2.32 GPU-hours (0.04 lost), $0.42 ($0.01 lost), with on-demand at its list price and moto's "
        "placeholder spot prices, not what spot costs"
    )


def test_the_interruption_demos_savings_speak_of_the_type_the_job_ran_on():
    facts = {
        "instance_types": ["g5.xlarge", "g5.xlarge"],
        "gpu_hours": 0.01,
        "gpu_hours_lost": 0.0001,
        "steps_lost": 0,
    }
    text = localcmd.savings_text(facts)
    assert text.startswith("what spot saves: this job ran on g5.xlarge ($1.006/h on demand, the US East list")
    assert "placeholders" in text and "p3.2xlarge (1 V100) at $0.9731/h" in text  # the paper's, as such
    assert text.endswith("0 steps redone.")
    unknown = localcmd.savings_text({**facts, "steps_lost": None})
    assert "None" not in unknown and "steps redone not known" in unknown


def test_the_timeline_picture_of_a_finished_job_says_spent_at_placeholder_prices():
    from spotguard_cli.answers import StatusView
    from spotguard_cli.timeline_plot import _title

    job = {"job_id": "demo", "state": "succeeded", "spend": {"gpu_hours": 0.01, "dollars": 0.0}}
    assert (
        _title(StatusView.model_validate(job), shared.PLACEHOLDER_PRICES)
        == "job demo: succeeded - spent $0.00 at moto's placeholder prices"
    )
    running = {**job, "state": "running"}
    assert _title(StatusView.model_validate(running)) == "job demo: running - $0.00 so far"


# ------------------------------------------------------------------------------------ jobs answers
def _summary(state: str) -> dict[str, Any]:
    return {
        "job_id": "j1",
        "state": state,
        "gpus": 1,
        "attempts": 1,
        "checkpoint_uri": "s3://b/jobs/j1/",
        "last_reason": "cancelled by the user",
    }


def test_a_cancel_under_way_reads_as_one_not_as_a_job_still_running():
    text = jobs_cli.render({"ok": True, "action": "cancel", "job": _summary("running")})
    first, second = text.splitlines()[:2]
    assert first == "job j1: cancelling  (1 GPU, 1 attempt(s))"
    assert second.startswith("  cancel under way: its task is being stopped; the job is running until it has")
    done = jobs_cli.render({"ok": True, "action": "cancel", "job": _summary("cancelled")})
    assert done.splitlines()[0] == "job j1: cancelled  (1 GPU, 1 attempt(s))"
    status = jobs_cli.render({"ok": True, "action": "status", "job": _summary("running")})
    assert status.splitlines()[0] == "job j1: running  (1 GPU, 1 attempt(s))"


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(10, "10s"), (59, "59s"), (60, "1m"), (250, "4m10s"), (2700, "45m"), (7380, "2h03m")],
)
def test_an_attempts_duration_is_never_zero_minutes(seconds, said):
    from datetime import UTC, datetime, timedelta

    from spotguard_cli.answers import AttemptView
    from spotguard_cli.jobs.log_lines import between_line, duration_text

    assert duration_text(seconds) == said
    start = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)
    before = {
        "number": 1,
        "task_arn": "arn:aws:ecs:us-east-1:1:task/c/aaaa",
        "started_at": start.isoformat(),
        "stopped_at": (start + timedelta(seconds=seconds)).isoformat(),
        "outcome": "resubmit",
        "outcome_reason": "spot",
    }
    after = {"number": 2, "task_arn": "arn:aws:ecs:us-east-1:1:task/c/bbbb"}
    read = AttemptView.model_validate
    assert f" after {said}: " in between_line(read(before), read(after), [])


# --------------------------------------------------------------------------------------- local stack
def test_the_local_stack_page_names_every_kind_inject_takes():
    parser = build_parser()
    local = next(
        a for a in parser._subparsers._group_actions[0].choices["local"]._actions if a.dest == "local_action"
    )
    inject = local.choices["inject"]
    kinds = next(a for a in inject._actions if a.dest == "kind").choices
    page = (REPO / "docs" / "local-stack.md").read_text()
    missing = [k for k in kinds if f"`{k}`" not in page]
    assert {"launch-successful", "launch-unsuccessful"} <= set(kinds) and not missing, missing


def test_local_up_hints_set_region_and_credentials_as_well_as_the_endpoint():
    state = {"endpoint": "http://127.0.0.1:4566", "region": "us-east-1", "instances": ["i-0123456789abcdef0"]}
    lines = up.try_lines(state, "gpu-spot").splitlines()
    export = next(line.split() for line in lines if "export" in line)
    assert export[1:] == [
        "AWS_ENDPOINT_URL=http://127.0.0.1:4566",
        "AWS_DEFAULT_REGION=us-east-1",
        "AWS_ACCESS_KEY_ID=testing",
        "AWS_SECRET_ACCESS_KEY=testing",
    ]
    assert any(line.strip() == "aws ecs list-tasks --cluster gpu-spot" for line in lines)
