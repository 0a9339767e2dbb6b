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

from spotguard.domain.commands import parse_command
from spotguard_cli import jobs as jobs_cli
from spotguard_cli import localcmd
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
            ["jobs", "submit", "--cluster", "c", "--task-definition", "t", "--deadline", "tomorrow"],
            "spotguard jobs submit: argument --deadline: 'tomorrow' is not an ISO 8601 time: "
            "give one like 2026-12-01T18:00:00Z",
        ),
        (
            ["jobs", "submit", "--cluster", "c", "--task-definition", "t", "--deadline", "2026-12-01T18:00"],
            "spotguard jobs submit: argument --deadline: '2026-12-01T18:00' has no time zone "
            "(add Z or +00:00): give one like 2026-12-01T18:00:00Z",
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
            "spotguard jobs submit: --max-attempts: Input should be greater than or equal to 1",
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
