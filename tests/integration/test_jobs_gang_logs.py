"""`spotguard jobs` for multi-node jobs (gangs): `submit --nodes N [--rendezvous-port P]` into the
function's options, `status` with the node count and one line per node under each attempt (read from the
answer the function gives, through JSON), and `logs` with every node's stream in time order, each line
named by its node, or one node's with --node. One-node jobs render as before (their own tests)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from moto import mock_aws

from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.jobs.answers import JobStatus
from spotguard.domain.jobs.commands import Answer, parse_command
from spotguard.domain.jobs.model import Attempt, JobState, NodeTask
from spotguard.domain.jobs.submission import JobOptions
from spotguard_cli import jobs as jobs_cli
from spotguard_cli.answers import NodeView, read_answer
from spotguard_cli.clock import FakeClock
from spotguard_cli.main import build_parser
from tests.integration.test_jobs_logs_cli import FAKE_TASK, World, answer, attempt
from tests.unit.test_job_engine import TASK, _job

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=2)
WARNING = "SpotGuard: spot-interruption#evt-1#i-0b1 (spot warning)"
GANG = "SpotGuard: gang of job j1: node 1's instance is going (spot-interruption)"


def _args(*argv: str):
    return build_parser().parse_args(["jobs", *argv])


# ------------------------------------------------------------------------------------------ submit
def test_nodes_and_the_rendezvous_port_go_to_the_jobs_options():
    args = _args("submit", "--cluster", "gpu-spot", "--task-definition", "t:1", "--nodes", "4")
    body = jobs_cli.payload(args)
    assert body["options"] == {"nodes": 4}
    args = _args(
        "submit", "--cluster", "gpu-spot", "--task-definition", "t:1", "--nodes", "2",
        "--rendezvous-port", "29600",
    )  # fmt: skip
    body = jobs_cli.payload(args)
    assert body["options"] == {"nodes": 2, "rendezvous_port": 29600}
    assert parse_command(body).options.nodes == 2  # the function takes it as it is


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--nodes", "65"], "argument --nodes: must be a whole number from 1 to 64, not 65"),
        (["--nodes", "0"], "argument --nodes: must be a whole number from 1 to 64, not 0"),
        (["--nodes", "two"], "argument --nodes: 'two' is not a whole number"),
        (["--nodes", "2", "--rendezvous-port", "80"], "must be a whole number from 1024 to 65535, not 80"),
    ],
)
def test_bad_node_flags_are_one_line_exit_2(argv, said, capsys):
    with pytest.raises(SystemExit) as exited:
        _args("submit", "--cluster", "c", "--task-definition", "t:1", *argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and said in err and err.count("\n") == 1
    assert err.startswith("spotguard jobs submit: ")


def test_a_rendezvous_port_without_nodes_is_refused_before_anything_is_invoked(capsys):
    args = _args("submit", "--cluster", "c", "--task-definition", "t:1", "--rendezvous-port", "29600")
    assert jobs_cli.run(args, invoke=None, out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err == "spotguard jobs submit: --rendezvous-port: for a multi-node job (give --nodes 2 or more)\n"


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"rendezvous_port": 29600}, "options.rendezvous_port: for a multi-node job (nodes: 2 or more)"),
        ({"nodes": 1, "rendezvous_port": 29600}, "options.rendezvous_port: for a multi-node job"),
        ({"nodes": True}, "options.nodes: Input should be a valid integer"),
        ({"nodes": "2"}, "options.nodes: Input should be a valid integer"),
        ({"nodes": 2.0}, "options.nodes: Input should be a valid integer"),
        ({"max_attempts": True}, "options.max_attempts: Input should be a valid integer"),
    ],
)
def test_the_jobs_function_refuses_what_the_spec_refuses(options, said):
    """Issue 45, item 7: one strict model for both doors (`nodes: true` was a 1-node job, "2" two nodes,
    and the function took a rendezvous port for one node that the spec refuses)."""
    from spotguard.domain.jobs.commands import CommandError

    payload = {"action": "submit", "request": {"cluster": "c", "taskDefinition": "t:1"}, "options": options}
    with pytest.raises(CommandError) as err:
        parse_command(payload)
    assert said in str(err.value) and "\n" not in str(err.value), str(err.value)
    ok = {**payload, "options": {"nodes": 2, "rendezvous_port": 29600}}
    assert parse_command(ok).options.rendezvous_port == 29600


# ------------------------------------------------------------------------------------------ status
def _node(node: int, suffix: str, **kw: Any) -> NodeTask:
    fields: dict[str, Any] = {
        "node": node,
        "task_arn": f"{TASK}{suffix}",
        "launched_at": T0 + timedelta(minutes=2),
        "started_at": T0 + timedelta(minutes=4),
        "last_status": "RUNNING",
        "instance_id": f"i-0{suffix}",
        "instance_type": "g5.48xlarge",
        "availability_zone": "us-east-1a",
        "lifecycle": "spot",
        "price_per_hour": 5.0,
    }
    return NodeTask(**{**fields, **kw})


def _stopped(**kw: Any) -> dict[str, Any]:
    return {"last_status": "STOPPED", "stopped_at": T0 + timedelta(minutes=50), **kw}


def _gang_status(**job: Any) -> dict[str, Any]:
    """A 2-node job as the function answers it: attempt 1 formed, warned on node 1, stopped whole and
    resubmitted; attempt 2 given up before it formed (node 1 could not be placed); attempt 3 forming
    (node 0 runs, node 1 not launched yet)."""
    first = Attempt(
        number=1,
        task_arn=f"{TASK}aaaa0000",
        launched_at=T0,
        started_at=T0 + timedelta(minutes=3),
        last_status="STOPPED",
        stopped_at=T0 + timedelta(minutes=51),
        instance_id="i-0a0",
        instance_type="g5.48xlarge",
        availability_zone="us-east-1a",
        lifecycle="spot",
        price_per_hour=5.0,
        exit_codes={"train": 75},
        stopped_reason=GANG,
        verdict="resubmit",
        verdict_reason="exit 75: stopped on a committed checkpoint",
        outcome="resubmit",
        outcome_reason="node 1: stopped by SpotGuard for spot-interruption#evt-1#i-0b1",
        interrupted_by="spot-interruption#evt-1#i-0b1",
        nodes=2,
        peers=[
            _node(
                1,
                "bbbb1111",
                **_stopped(
                    exit_codes={"train": 75},
                    stopped_reason=WARNING,
                    verdict="resubmit",
                    verdict_reason="stopped by SpotGuard for spot-interruption#evt-1#i-0b1 " + "x" * 80,
                    notice="spot-interruption#evt-1#i-0b1",
                ),
            )
        ],
        formed_at=T0 + timedelta(minutes=4),
        gang_stopped_at=T0 + timedelta(minutes=49),
    )
    second = Attempt(
        number=2,
        task_arn=f"{TASK}cccc2222",
        launched_at=T0 + timedelta(minutes=52),
        last_status="STOPPED",
        stopped_at=T0 + timedelta(minutes=55),
        exit_codes={"train": 143},
        outcome="resubmit",
        outcome_reason="the gang did not form: node 1: RunTask placed nothing (RESOURCE:GPU)",
        nodes=2,
        abandoned="node 1: RunTask placed nothing (RESOURCE:GPU)",
        gang_stopped_at=T0 + timedelta(minutes=53),
    )
    third = Attempt(
        number=3,
        task_arn=f"{TASK}dddd3333",
        launched_at=T0 + timedelta(minutes=90),
        started_at=T0 + timedelta(minutes=93),
        last_status="RUNNING",
        instance_id="i-0d0",
        instance_type="g5.48xlarge",
        availability_zone="us-east-1b",
        lifecycle="spot",
        nodes=2,
    )
    kw: dict[str, Any] = {
        "state": JobState.RUNNING,
        "gpus": 8,
        "options": JobOptions(nodes=2),
        "attempts": [first, second, third],
        **job,
    }
    status = JobStatus.of(_job(**kw), list[CheckpointRef](), NOW)
    return json.loads(json.dumps(Answer(ok=True, action="status", job=status).wire()))


def test_a_gang_status_is_read_node_by_node():
    job = read_answer(_gang_status()).status()
    assert job.nodes == 2
    first, second, third = job.attempts
    assert first.gang and first.nodes == 2 and first.formed_at == T0 + timedelta(minutes=4)
    (peer,) = first.peers
    assert isinstance(peer, NodeView) and peer.node == 1 and peer.verdict == "resubmit" and peer.stopped
    assert [t.node for t in first.tasks] == [0, 1] and not first.live
    assert second.abandoned and second.formed_at is None and third.live and third.peers == []


def test_status_shows_the_node_count_each_gang_and_a_line_per_node():
    code, out = _status(_gang_status())
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "job j1: running  (2 nodes x 8 GPU, 3 attempt(s))"
    at = lines.index(next(x for x in lines if x.startswith("#  TASK")))
    rows = lines[at + 1 :]
    assert rows[0].startswith("1  aaaa0000") and "resubmit" in rows[0]
    assert rows[1] == "   gang of 2 nodes: formed 2026-11-22 12:04:00; stopped whole 2026-11-22 12:49:00"
    node0, node1 = rows[2].split(), rows[3].split()
    assert node0[:7] == ["node", "0", "aaaa0000", "STOPPED", "i-0a0", "g5.48xlarge/us-east-1a", "exit"]
    assert node0[7:9] == ["75", "resubmit"] and rows[2].endswith(
        "(exit 75: stopped on a committed checkpoint)"
    )
    assert node1[:4] == ["node", "1", "bbbb1111", "STOPPED"] and "i-0bbbb1111" in rows[3]
    assert rows[3].endswith("…)") and len(rows[3]) < 200  # a long reason is cut; --json has it whole
    # the node lines line up with each other
    assert rows[2].index("STOPPED") == rows[3].index("STOPPED")
    assert rows[4].startswith("2  cccc2222")
    assert rows[5] == (
        "   gang of 2 nodes: given up before it formed (node 1: RunTask placed nothing (RESOURCE:GPU)); "
        "not counted as an attempt"
    )
    assert rows[6].split()[:5] == ["node", "0", "cccc2222", "STOPPED", "-"] and "exit 143" in rows[6]
    assert rows[7].split() == ["node", "1", "-", "never", "launched"]
    assert rows[8].startswith("3  dddd3333")
    assert rows[9] == "   gang of 2 nodes: forming: 1 of 2 nodes running"
    assert rows[10].split()[:4] == ["node", "0", "dddd3333", "RUNNING"]
    assert rows[11].split() == ["node", "1", "-", "not", "launched", "yet"]


def test_an_old_gangs_folded_nodes_are_counted_not_listed():
    wire = _gang_status()
    first = wire["job"]["attempts"][0]
    first["peers"], first["folded_peers"] = [], 1  # as the ledger keeps an old gang
    code, out = _status(wire)
    assert code == 0
    lines = out.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("   gang of 2 nodes: formed")))
    assert lines[at + 1].split()[:2] == ["node", "0"]
    assert lines[at + 2].split()[:4] == ["1", "other", "node", "-"]
    assert "folded" in lines[at + 2] and lines[at + 2].endswith(
        "records not kept (an old gang's); spend counts them"
    )


def test_json_passes_a_gang_status_through(capsys):
    wire = _gang_status()
    code, out = _status(wire, "--json")
    assert code == 0 and json.loads(out) == wire
    assert json.loads(out)["job"]["attempts"][0]["peers"][0]["node"] == 1


def test_a_one_node_status_shows_no_node_lines():
    wire = _gang_status(options=JobOptions(), attempts=[], gpus=1)
    code, out = _status(wire)
    assert code == 0 and out.splitlines()[0] == "job j1: running  (1 GPU, 0 attempt(s))" and "node" not in out


def _status(wire: dict[str, Any], *flags: str) -> tuple[int, str]:
    out = io.StringIO()
    code = jobs_cli.run(
        _args(*flags, "status", "j1"), invoke=lambda body: wire, out=out, clock=FakeClock(NOW)
    )
    return code, out.getvalue()


# -------------------------------------------------------------------------------------------- logs
@pytest.fixture
def world() -> Iterator[World]:
    with mock_aws():
        yield World()


def _gang_attempt(number: int, arn0: str, arn1: str | None, **kw: Any) -> dict[str, Any]:
    a = attempt(number, arn0, nodes=2, **kw)
    if arn1 is not None:
        a["peers"] = [
            {k: v for k, v in attempt(number, arn1, node=1).items() if k not in ("number", "pool", "market")}
        ]
    return a


def _logs(world: World, *argv: str, clock: FakeClock | None = None) -> tuple[int, list[str]]:
    args = _args(*argv)
    out = io.StringIO()
    code = jobs_cli.run(args, invoke=world.invoke, out=out, clock=clock or FakeClock(T0))
    return code, out.getvalue().splitlines()


def _interleaved(world: World, arn0: str, arn1: str) -> None:
    """Each node's lines, a second apart, in turns: node 0, node 1, node 0, node 1."""
    world.put(arn0, "rank 0 up")
    world.put(arn1, "rank 8 up")
    world.put(arn0, "step 1 rank 0")
    world.put(arn1, "step 1 rank 8")


def test_every_nodes_lines_in_time_order_named_by_node(world: World):
    arn0, arn1 = world.run_task(), world.run_task()
    _interleaved(world, arn0, arn1)
    world.status = answer("running", [_gang_attempt(1, arn0, arn1)], options={"nodes": 2})
    code, lines = _logs(world, "logs", "j1")
    assert code == 0
    assert lines[0].startswith(
        f"--- attempt 1: 2 nodes, node 0's task {arn0.rsplit('/', 1)[-1][:12]} on spot"
    )
    assert lines[1:5] == [
        "[node 0] rank 0 up",
        "[node 1] rank 8 up",
        "[node 0] step 1 rank 0",
        "[node 1] step 1 rank 8",
    ]
    assert lines[5].startswith("--- job j1 is running") and len(lines) == 6

    code, lines = _logs(world, "logs", "j1", "--node", "1", "--timestamps")
    assert code == 0 and [x.split(" ", 1)[1] for x in lines[1:-1]] == ["rank 8 up", "step 1 rank 8"]

    code, lines = _logs(world, "--json", "logs", "j1")
    records = [json.loads(x) for x in lines if "message" in x]
    assert [(r["node"], r["message"]) for r in records][:2] == [(0, "rank 0 up"), (1, "rank 8 up")]


def test_node_flag_bounds_and_a_node_not_launched(world: World, capsys):
    arn0 = world.run_task()
    world.put(arn0, "waiting for the others")
    world.status = answer("running", [_gang_attempt(1, arn0, None)], options={"nodes": 2})
    code, lines = _logs(world, "logs", "j1", "--node", "1")
    assert code == 0 and lines[1] == "attempt 1: node 1 is not launched yet"
    code, _ = _logs(world, "logs", "j1", "--node", "2")
    assert code == 1
    assert "job j1 has 2 node(s): --node is from 0 to 1, not 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args("logs", "j1", "--node", "-1")
    # a one-node job: --node 0 is its only node, unnamed
    world.status = answer("running", [attempt(1, arn0)])
    code, lines = _logs(world, "logs", "j1", "--node", "0")
    assert code == 0 and lines[1] == "waiting for the others"


def test_follow_picks_up_a_node_launched_after_node_0_runs(world: World):
    """Node 0 runs first; node 1 is launched once it does: --follow reads node 1's stream from its
    start when it appears, even lines older than what it has read of node 0 (ingestion is late)."""
    arn0, arn1 = world.run_task(), world.run_task()
    world.put(arn0, "node 0 waiting")
    world.status = answer("running", [_gang_attempt(1, arn0, None)], options={"nodes": 2})

    def on_sleep(n: int) -> None:
        if n == 1:  # node 1 launched; its first line 30 s before node 0's newest read
            world.ms -= 30_000
            world.put(arn1, "node 1 joined")
            world.ms += 60_000
            world.put(arn0, "training")
            world.status = answer("running", [_gang_attempt(1, arn0, arn1)], options={"nodes": 2})
        elif n == 2:
            world.status = answer(
                "succeeded",
                [_gang_attempt(1, arn0, arn1, last_status="STOPPED", outcome="succeeded")],
                options={"nodes": 2},
                last_reason="all 2 nodes exited 0",
            )

    code, lines = _logs(world, "logs", "j1", "--follow", clock=FakeClock(T0, on_sleep))
    assert code == 0
    assert lines[1:4] == ["[node 0] node 0 waiting", "[node 1] node 1 joined", "[node 0] training"]
    assert lines[-1] == "--- job j1 succeeded: all 2 nodes exited 0" and len(lines) == 5


def test_an_old_gangs_folded_nodes_are_said_in_one_line(world: World):
    arn0 = world.run_task()
    world.put(arn0, "epoch 1")
    folded = {**_gang_attempt(1, arn0, None, last_status="STOPPED", outcome="resubmit"), "folded_peers": 1}
    world.status = answer("running", [folded, _gang_attempt(2, FAKE_TASK, None)], options={"nodes": 2})
    code, lines = _logs(world, "logs", "j1", "--attempt", "1")
    assert code == 0
    folded_note = "attempt 1: the records of its other 1 node(s) were folded (an old gang's): "
    assert lines[1:3] == [f"{folded_note}their logs cannot be found", "[node 0] epoch 1"]


def test_a_summary_answer_says_the_node_count_and_a_cancel_that_every_node_is_stopping():
    from spotguard.domain.jobs.answers import JobSummary
    from spotguard_cli.jobs.render import render

    job = _job(state=JobState.RUNNING).model_copy(update={"options": JobOptions(nodes=2)})
    summary = JobSummary.of(job).model_dump(mode="json")
    assert summary["nodes"] == 2
    text = render({"ok": True, "action": "cancel", "job": summary})
    assert f"2 nodes x {job.gpus} GPU" in text and "every one of its 2 nodes is being stopped" in text
    one = JobSummary.of(_job(state=JobState.RUNNING)).model_dump(mode="json")
    assert "its task is being stopped" in render({"ok": True, "action": "cancel", "job": one})
