"""`spotguard explain`: one JSON line per file, exit 1 on any reject, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

from spotguard_cli.emulator.inject import sqs_samples
from spotguard_cli.main import main

from ..conftest import EVENTS, REPO


def _run(capsys, *args):
    code = main(["explain", *args])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return code, lines


def test_every_sample_event_is_explained_and_none_rejected(capsys):
    files = sorted(str(p) for p in EVENTS.glob("*.json"))
    code, lines = _run(capsys, "--clusters", "gpu-spot", *files)
    assert code == 0 and len(lines) == len(files)
    by_file = {line["file"].rsplit("/", 1)[-1]: line for line in lines}
    warning = by_file["spot-interruption-warning.json"]
    assert warning["outcome"] == "act" and warning["kind"] == "spot-interruption"
    assert warning["instance_id"] == "i-0b662ef9931388ba0"
    assert warning["actions"] == ["record-notice", "drain-container-instance", "stop-managed-tasks"]
    assert warning["deadline"] == "2026-11-21T14:48:03+00:00"
    assert by_file["ecs-task-state-change.json"]["task_arn"].endswith("9f1e2d3c4b5a69788796a5b4c3d2e1f0")
    assert by_file["health-scheduled-retirement.json"]["instance_ids"] == [
        "i-0b662ef9931388ba0",
        "i-0d1e2f3a4b5c6d7e8",
    ]
    assert by_file["instance-state-running.json"]["outcome"] == "ignore"
    for line in lines:
        assert {"file", "outcome", "kind", "reason", "actions"} <= set(line)


def test_settings_change_the_explanation(capsys):
    f = str(EVENTS / "rebalance-recommendation.json")
    _, (default,) = _run(capsys, f)
    _, (ignored,) = _run(capsys, "--rebalance", "ignore", f)
    _, (drained,) = _run(capsys, "--rebalance", "drain", "--manage", "all-gpu", f)
    assert default["actions"] == [
        "record-notice",
        "signal-managed-tasks-SIGUSR1",
        "record-rebalance-on-pool",
    ]
    assert ignored["outcome"] == "ignore"
    assert "stop-managed-tasks" in drained["actions"] and "any GPU task" in drained["managed_tasks"]


def test_bad_files_are_rejected_with_one_line_and_exit_1(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "x", "source": "aws.ec2"')
    good = str(EVENTS / "spot-interruption-warning.json")
    code, lines = _run(capsys, good, str(bad), str(tmp_path / "missing.json"))
    assert code == 1
    assert [line["outcome"] for line in lines] == ["act", "reject", "reject"]
    assert lines[1]["reason"].startswith("not valid JSON")
    assert lines[2]["reason"].startswith("cannot read the file")


def test_the_installed_command_reads_stdin_and_prints_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "spotguard_cli.main", "explain", "-"],
        input=b"\x00garbage",
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr + proc.stdout
    assert json.loads(proc.stdout)["outcome"] == "reject"


def test_bad_arguments_get_a_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "spotguard_cli.main", "explain", "--rebalance", "sometimes", "x.json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "invalid choice" in proc.stderr and "Traceback" not in proc.stderr


def test_sqs_samples_wrap_exactly_the_eventbridge_samples():
    expected = sqs_samples()
    on_disk = {p.name: json.loads(p.read_text()) for p in (REPO / "events" / "sqs").glob("*.json")}
    assert on_disk == expected, "run: python -m spotguard_cli.emulator.inject  (regenerates events/sqs)"


def test_a_deeply_nested_file_is_rejected_in_one_line(capsys, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    code, (line,) = _run(capsys, str(deep))
    assert code == 1 and line["outcome"] == "reject" and "nested" in line["reason"]


def test_explain_acts_on_aws_s_own_retirement_example_which_names_its_instance_by_arn(capsys, tmp_path):
    from tests.unit.test_notices import AWS_RETIREMENT_EXAMPLE

    path = tmp_path / "retirement.json"
    path.write_text(json.dumps(AWS_RETIREMENT_EXAMPLE))
    code, (line,) = _run(capsys, str(path))
    assert code == 0
    assert line["outcome"] == "act" and line["kind"] == "health-maintenance"
    assert line["instance_id"] == "i-1234567890abcdef0"  # one instance: named alone
    assert "stop-managed-tasks" in line["actions"]
