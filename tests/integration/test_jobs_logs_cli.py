"""`spotguard jobs logs`, `jobs status --watch` and `jobs status --plot`: against moto in-process (ECS
and CloudWatch Logs), the jobs function's status answer faked through the CLI's invoke, and a clock that
never sleeps."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from spotguard_cli import jobs as jobs_cli
from spotguard_cli.clock import FakeClock
from spotguard_cli.main import build_parser
from spotguard_cli.timeline_plot import plot_job

REGION = "us-east-1"
GROUP = "/spotguard/train"
T0 = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)
FAKE_TASK = "arn:aws:ecs:us-east-1:123456789012:task/gpu/0123456789abcdef0123456789abcdef"
CKPT = "s3://ckpt/jobs/j1/"


# ------------------------------------------------------------------------------------------ the world
class World:
    """An ECS cluster with one container instance, task definitions with and without awslogs, and the
    job's status answer as a dict the test changes between polls."""

    def __init__(self) -> None:
        self.ecs = boto3.client("ecs", region_name=REGION)
        self.logs = boto3.client("logs", region_name=REGION)
        ec2 = boto3.client("ec2", region_name=REGION)
        self.ecs.create_cluster(clusterName="gpu")
        instance = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)["Instances"][0]
        self.ecs.register_container_instance(
            cluster="gpu", instanceIdentityDocument=json.dumps({"instanceId": instance["InstanceId"]})
        )
        awslogs = {
            "logDriver": "awslogs",
            "options": {"awslogs-group": GROUP, "awslogs-stream-prefix": "ecs"},
        }
        self.ecs.register_task_definition(
            family="train",
            containerDefinitions=[
                {"name": "trainer", "image": "t", "cpu": 256, "memory": 512, "logConfiguration": awslogs}
            ],
        )
        self.ecs.register_task_definition(
            family="pair",
            containerDefinitions=[
                {"name": n, "image": "t", "cpu": 128, "memory": 256, "logConfiguration": awslogs}
                for n in ("trainer", "agent")
            ],
        )
        self.ecs.register_task_definition(
            family="plain", containerDefinitions=[{"name": "main", "image": "t", "cpu": 256, "memory": 512}]
        )
        self.logs.create_log_group(logGroupName=GROUP)
        self.ms = int(time.time() * 1000) - 3_600_000  # event times: an hour ago onwards
        self.status: dict[str, Any] = {}
        self.asked = 0
        self.failing = False

    def run_task(self, family: str = "train") -> str:
        task = self.ecs.run_task(cluster="gpu", taskDefinition=family, launchType="EC2")["tasks"][0]
        return str(task["taskArn"])

    def put(self, task_arn: str, *messages: str, container: str = "trainer") -> None:
        stream = f"ecs/{container}/{task_arn.rsplit('/', 1)[-1]}"
        with contextlib.suppress(self.logs.exceptions.ResourceAlreadyExistsException):
            self.logs.create_log_stream(logGroupName=GROUP, logStreamName=stream)
        events = []
        for m in messages:
            self.ms += 1000
            events.append({"timestamp": self.ms, "message": m})
        self.logs.put_log_events(logGroupName=GROUP, logStreamName=stream, logEvents=events)

    def invoke(self, body: dict[str, Any]) -> dict[str, Any]:
        assert body == {"action": "status", "job_id": "j1"}
        self.asked += 1
        if self.failing:
            raise ConnectionError("no network")
        return copy.deepcopy(self.status)


def attempt(number: int, task_arn: str, **kw: Any) -> dict[str, Any]:
    a = {
        "number": number,
        "task_arn": task_arn,
        "launched_at": (T0 + timedelta(hours=number - 1)).isoformat(),
        "started_at": (T0 + timedelta(hours=number - 1, minutes=5)).isoformat(),
        "last_status": "RUNNING",
        "resume_from": "",
        "exit_codes": {},
        "instance_type": "g5.xlarge",
        "availability_zone": "us-east-1a",
        "lifecycle": "spot",
        "market": "spot",
        "pool": f"gpu-spot/g5.xlarge/us-east-1{'ab'[number % 2]}",
    }
    a.update(kw)
    return a


def interrupted(a: dict[str, Any]) -> dict[str, Any]:
    return {
        **a,
        "last_status": "STOPPED",
        "stopped_at": (T0 + timedelta(minutes=50)).isoformat(),
        "stop_code": "SpotInterruption",
        "exit_codes": {"trainer": 143},
        "outcome": "resubmit",
        "outcome_reason": "stopped by SpotGuard for spot-interruption#evt-1#i-0abc",
        "interrupted_by": "spot-interruption#evt-1#i-0abc",
    }


def checkpoint(seq: int, step: int, attempt_no: int, minutes: int) -> dict[str, Any]:
    return {
        "prefix_uri": CKPT,
        "sequence": seq,
        "manifest_uri": f"{CKPT}ckpt-{seq:06d}/MANIFEST.json",
        "step": step,
        "progress": step / 1000,
        "attempt": attempt_no,
        "job_id": "j1",
        "created_at": (T0 + timedelta(minutes=minutes)).isoformat(),
    }


def answer(state: str, attempts: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    job = {
        "job_id": "j1",
        "state": state,
        "origin": "submitted",
        "gpus": 1,
        "task_arn": attempts[-1]["task_arn"] if attempts else None,
        "instance_type": "g5.xlarge",
        "checkpoint_uri": CKPT,
        "created_at": T0.isoformat(),
        "updated_at": (T0 + timedelta(hours=2)).isoformat(),
        "retry_at": None,
        "finished": state in ("succeeded", "failed", "cancelled", "gave-up"),
        "last_reason": kw.pop("last_reason", "launched"),
        "decision": None,
        "request": {"cluster": "gpu", "taskDefinition": kw.pop("task_definition", "train:1")},
        "options": {"max_attempts": 20, "deadline": None},
        "attempts": attempts,
        "checkpoints": kw.pop("checkpoints", []),
        "snapshots": [],
        "spend": kw.pop(
            "spend", {"gpu_hours": 1.5, "gpu_hours_lost": 0.1, "dollars": 1.2, "dollars_lost": 0.08}
        ),
        "decisions": [],
        "move": None,
        "moves_made": 0,
        "avoiding": {"instances": [], "pools": []},
    }
    job.update(kw)
    return {"ok": True, "action": "status", "job": job}


@pytest.fixture
def world() -> Iterator[World]:
    with mock_aws():
        yield World()


def _run(world: World | None, *argv: str, clock: FakeClock | None = None, tty: bool | None = None):
    args = build_parser().parse_args(["jobs", *argv])
    out = io.StringIO()
    invoke = world.invoke if world is not None else None
    code = jobs_cli.run(args, invoke=invoke, out=out, clock=clock or FakeClock(T0), tty=tty)
    return code, out.getvalue().splitlines()


# ---------------------------------------------------------------------------------------------- logs
def test_two_attempts_in_order_with_why_the_first_stopped_and_where_the_second_resumed(world: World):
    first = world.run_task()  # known to ECS: read through its own task definition revision
    world.put(first, "epoch 1", "epoch 2")
    world.put(FAKE_TASK, "restored step 200", "epoch 3")  # an attempt ECS no longer knows
    world.status = answer(
        "succeeded",
        [
            interrupted(attempt(1, first)),
            attempt(
                2,
                FAKE_TASK,
                resume_from=f"{CKPT}ckpt-000002/MANIFEST.json",
                market="on-demand",
                last_status="STOPPED",
                outcome="succeeded",
                stopped_at=(T0 + timedelta(hours=2)).isoformat(),
                exit_codes={"trainer": 0},
            ),
        ],
        checkpoints=[checkpoint(1, 100, 1, 20), checkpoint(2, 200, 1, 40)],
        last_reason="the job's container exited 0",
    )
    code, lines = _run(world, "logs", "j1")
    assert code == 0
    assert lines[0].startswith("--- attempt 1: task ") and "on spot gpu-spot/g5.xlarge/us-east-1b" in lines[0]
    assert "from scratch" in lines[0]
    assert lines[1:3] == ["epoch 1", "epoch 2"]
    between = lines[3]
    assert between.startswith("--- attempt 1 stopped at 2026-05-01 08:50:00 after 45m: ")
    assert "interrupted: spot-interruption on i-0abc" in between and "exit trainer=143" in between
    assert "SpotInterruption" in between
    assert "-> attempt 2 (task 0123456789ab on on-demand gpu-spot/g5.xlarge/us-east-1a)" in between
    assert between.endswith("resumed from checkpoint #2 (step 200, 20%)")
    assert lines[4:6] == ["restored step 200", "epoch 3"]
    assert lines[6] == "--- job j1 succeeded: the job's container exited 0"
    assert len(lines) == 7


def test_since_attempt_timestamps_and_json(world: World):
    first = world.run_task()
    world.put(first, "old line")
    cutoff = datetime.fromtimestamp((world.ms + 500) / 1000, UTC)
    world.put(first, "new line")
    world.status = answer("running", [attempt(1, first)])
    code, lines = _run(world, "logs", "j1", "--since", cutoff.isoformat(), "--timestamps", "--attempt", "1")
    assert code == 0
    assert [line.split(" ", 1)[1] for line in lines[1:-1]] == ["new line"]
    assert lines[1].split(" ", 1)[0].endswith("Z")
    assert lines[-1] == "--- job j1 is running (launched)"

    code, lines = _run(world, "--json", "logs", "j1")
    records = [json.loads(line) for line in lines]
    assert [r["message"] for r in records if "message" in r] == ["old line", "new line"]
    assert records[1]["attempt"] == 1 and records[1]["container"] == "trainer"
    assert "note" in records[0] and "note" in records[-1]


def test_a_task_without_awslogs_says_so_in_one_line(world: World):
    plain = world.run_task("plain")
    world.status = answer(
        "failed", [attempt(1, plain, last_status="STOPPED", outcome="failed")], task_definition="plain"
    )
    code, lines = _run(world, "logs", "j1")
    assert code == 0
    assert lines[1] == (
        "attempt 1: no container of plain:1 logs to CloudWatch Logs with awslogs (main (no log driver)): "
        "nothing to show for it"
    )
    assert len(lines) == 3 and lines[2].startswith("--- job j1 failed")


def test_a_tasks_containers_interleave_in_time_order_named(world: World):
    task = world.run_task("pair")
    world.put(task, "loading", container="trainer")
    world.put(task, "agent up", container="agent")
    world.put(task, "epoch 1", container="trainer")
    world.status = answer("running", [attempt(1, task)], task_definition="pair")
    code, lines = _run(world, "logs", "j1")
    assert code == 0 and lines[1:4] == ["[trainer] loading", "[agent] agent up", "[trainer] epoch 1"]


def test_a_log_read_refused_is_one_line_and_the_other_attempts_are_read(world: World, capsys):
    from botocore.exceptions import ClientError

    first, second = world.run_task(), world.run_task()
    world.put(second, "epoch 3")
    world.status = answer("running", [interrupted(attempt(1, first)), attempt(2, second)])
    calls = []

    class Refusing:
        def __init__(self, real: Any) -> None:
            self.real = real

        def get_paginator(self, name: str) -> Any:
            calls.append(name)
            if len(calls) == 1:
                raise ClientError(
                    {"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "FilterLogEvents"
                )
            return self.real.get_paginator(name)

    def aws(service: str, region: str | None = None) -> Any:
        client = boto3.client(service, region_name=region or REGION)
        return Refusing(client) if service == "logs" else client

    args = build_parser().parse_args(["jobs", "logs", "j1"])
    out = io.StringIO()
    assert jobs_cli.run(args, invoke=world.invoke, out=out, clock=FakeClock(T0), aws=aws) == 1
    assert "epoch 3" in out.getvalue().splitlines()
    err = capsys.readouterr().err
    assert err == "spotguard jobs logs: attempt 1: logs could not be read: AccessDeniedException: no\n"


def test_an_attempt_whose_task_definition_cannot_be_read_fails_that_attempt_only(world: World, capsys):
    world.status = answer("running", [attempt(1, FAKE_TASK)], task_definition="gone:7")
    code, lines = _run(world, "logs", "j1")
    assert code == 1
    assert "attempt 1: task definition gone:7 could not be read" in capsys.readouterr().err
    assert lines[-1].startswith("--- job j1 is running")


def test_follow_sees_new_events_and_a_new_attempt_then_stops_when_the_job_ends(world: World):
    first, second = world.run_task(), world.run_task()
    world.put(first, "epoch 1")
    world.status = answer("running", [attempt(1, first)])

    def on_sleep(n: int) -> None:
        if n == 1:  # more output from the running attempt
            world.put(first, "epoch 2")
        elif n == 2:  # still running: nothing new
            pass
        elif n == 3:  # interrupted; the job queued, then its second attempt is launched
            world.put(first, "SIGTERM: checkpointing")
            world.status = answer(
                "running",
                [
                    interrupted(attempt(1, first)),
                    attempt(2, second, resume_from=f"{CKPT}ckpt-000001/MANIFEST.json"),
                ],
                checkpoints=[checkpoint(1, 100, 1, 49)],
            )
            world.put(second, "restored step 100")
        elif n == 4:
            world.put(second, "epoch 3", "done")
            a2 = attempt(2, second, last_status="STOPPED", outcome="succeeded", exit_codes={"trainer": 0})
            world.status = answer(
                "succeeded",
                [interrupted(attempt(1, first)), a2],
                checkpoints=[checkpoint(1, 100, 1, 49)],
                last_reason="the job's container exited 0",
            )
        elif n == 5:  # the grace read after the end: the log driver's last flush
            world.put(second, "exiting")

    clock = FakeClock(T0, on_sleep)
    code, lines = _run(world, "logs", "j1", "--follow", "--interval", "7", clock=clock)
    assert code == 0
    assert lines[0].startswith("--- attempt 1:")
    assert lines[1:4] == ["epoch 1", "epoch 2", "SIGTERM: checkpointing"]
    assert (
        lines[4].startswith("--- attempt 1 stopped")
        and "resumed from checkpoint #1 (step 100, 10%)" in lines[4]
    )
    assert lines[5:9] == ["restored step 100", "epoch 3", "done", "exiting"]
    assert lines[9] == "--- job j1 succeeded: the job's container exited 0"
    assert clock.slept == [7.0, 7.0, 7.0, 7.0, 2.0]
    assert world.asked == 5


def test_follow_of_an_ended_job_reads_once_and_ctrl_c_stops_cleanly(world: World, capsys):
    first = world.run_task()
    world.status = answer("cancelled", [attempt(1, first, last_status="STOPPED", outcome="cancelled")])
    clock = FakeClock(T0)
    code, lines = _run(world, "logs", "j1", "--follow", clock=clock)
    assert code == 0 and clock.slept == [] and lines[-1].startswith("--- job j1 cancelled")

    world.status = answer("running", [attempt(1, first)])

    def interrupt(n: int) -> None:
        raise KeyboardInterrupt

    code, _ = _run(world, "logs", "j1", "--follow", clock=FakeClock(T0, interrupt))
    assert code == 130
    assert capsys.readouterr().err == "spotguard jobs logs: stopped following job j1 (it goes on)\n"


def test_follow_gives_up_after_failing_polls(world: World, capsys):
    first = world.run_task()
    world.status = answer("running", [attempt(1, first)])

    def refuse(n: int) -> None:
        world.failing = True

    code, _ = _run(world, "logs", "j1", "--follow", clock=FakeClock(T0, refuse))
    assert code == 1
    assert capsys.readouterr().err.count("poll failed") == 5


def _raise(body: dict[str, Any]) -> dict[str, Any]:
    raise ConnectionError("no network")


def test_the_function_refusing_is_exit_1(world: World, capsys):
    world.status = {"ok": False, "error": {"type": "NotFound", "message": "job j1 does not exist"}}
    code, lines = _run(world, "logs", "j1")
    assert code == 1 and lines == []
    assert capsys.readouterr().err == "spotguard jobs logs: NotFound: job j1 does not exist\n"


# --------------------------------------------------------------------------------------------- watch
def _watch_world(world: World) -> None:
    states = [
        answer("queued", [], last_reason="waiting for capacity"),
        answer("running", [attempt(1, FAKE_TASK)]),
        answer("running", [attempt(1, FAKE_TASK)], spend={"gpu_hours": 2.0, "gpu_hours_lost": 0.0}),
        answer("succeeded", [attempt(1, FAKE_TASK, last_status="STOPPED", outcome="succeeded")]),
    ]
    world.status = states[0]

    def on_sleep(n: int) -> None:
        world.status = states[min(n, len(states) - 1)]

    return on_sleep  # type: ignore[return-value]


def test_watch_prints_each_new_state_once_and_exits_when_the_job_ends(world: World):
    clock = FakeClock(T0, _watch_world(world))
    code, lines = _run(world, "status", "j1", "--watch", "--interval", "3", clock=clock)
    assert code == 0
    headers = [line for line in lines if line.startswith("--- 2026-05-01")]
    assert headers == [
        "--- 2026-05-01 08:00:00 UTC",
        "--- 2026-05-01 08:00:03 UTC",
        "--- 2026-05-01 08:00:09 UTC",
    ]
    firsts = [lines[lines.index(h) + 1] for h in headers]
    assert [f.split(":")[1].split()[0] for f in firsts] == ["queued", "running", "succeeded"]
    assert clock.slept == [3.0, 3.0, 3.0] and world.asked == 4


def test_watch_on_a_terminal_redraws_every_time(world: World):
    clock = FakeClock(T0, _watch_world(world))
    args = build_parser().parse_args(["jobs", "status", "j1", "--watch"])
    out = io.StringIO()
    assert jobs_cli.run(args, invoke=world.invoke, out=out, clock=clock, tty=True) == 0
    text = out.getvalue()
    assert text.count("\x1b[H\x1b[2J") == 4
    assert text.rstrip().endswith("UTC - the job has ended")


def test_watch_gives_up_when_the_function_keeps_failing(capsys):
    args = build_parser().parse_args(["jobs", "status", "j1", "--watch"])
    assert jobs_cli.run(args, invoke=_raise, out=io.StringIO(), clock=FakeClock(T0)) == 1
    assert capsys.readouterr().err.count("ConnectionError: no network") == 5


# ---------------------------------------------------------------------------------------------- plot
def _plotted() -> dict[str, Any]:
    a1 = interrupted(attempt(1, FAKE_TASK))
    a2 = {
        **attempt(2, FAKE_TASK, market="on-demand", pool="gpu-od/g5.xlarge/us-east-1a"),
        "last_status": "STOPPED",
        "stopped_at": (T0 + timedelta(hours=1, minutes=40)).isoformat(),
        "outcome": "resubmit",
        "outcome_reason": "moved: spot in gpu-spot/g5.xlarge/us-east-1b: cheaper",
    }
    a3 = attempt(3, FAKE_TASK)  # running
    return answer(
        "running",
        [a1, a2, a3],
        checkpoints=[checkpoint(1, 100, 1, 20), checkpoint(2, 200, 1, 40), checkpoint(3, 400, 2, 90)],
        options={"deadline": (T0 + timedelta(hours=6)).isoformat()},
        updated_at=(T0 + timedelta(hours=3)).isoformat(),
    )


def test_plot_draws_one_bar_per_attempt_from_the_json_alone(tmp_path: Path):
    status = json.loads(json.dumps(_plotted()))
    drawn = plot_job(status, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [(b.attempt, b.market, b.running) for b in drawn.bars] == [
        (1, "spot", False),
        (2, "on-demand", False),
        (3, "spot", True),
    ]
    (ax,) = drawn.figure.axes
    assert len(ax.patches) == 3  # the bars (the legend's patches are the legend's)
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "#1 gpu-spot/g5.xlarge/us-east-1b",
        "#2 gpu-od/g5.xlarge/us-east-1a",
        "#3 gpu-spot/g5.xlarge/us-east-1b",
    ]
    assert len(drawn.interruptions) == 1 and len(drawn.moves) == 1 and len(drawn.checkpoints) == 3
    assert ax.get_title() == "job j1: running - $1.20 so far ($0.08 lost)"
    # the running attempt ends at the newest time in the answer, or at `now` when given
    assert drawn.bars[2].end == T0 + timedelta(hours=3)
    later = plot_job(status["job"], str(tmp_path / "t.svg"), now=T0 + timedelta(hours=5))
    assert later.bars[2].end == T0 + timedelta(hours=5)


def test_plot_of_a_job_with_no_attempt_yet(tmp_path: Path):
    drawn = plot_job(answer("queued", [], spend={"gpu_hours": 0.0}), str(tmp_path / "q.png"))
    assert drawn.bars == [] and drawn.figure.axes[0].get_title() == "job j1: queued - 0.00 GPU-hours so far"


def test_status_plot_from_the_command_line(world: World, tmp_path: Path, capsys):
    world.status = _plotted()
    path = tmp_path / "timeline.png"
    code, lines = _run(world, "status", "j1", "--plot", str(path))
    assert code == 0 and lines[0].startswith("job j1: running")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert capsys.readouterr().err == f"timeline written to {path}\n"


# -------------------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "j1", "--interval", "5"], "--interval is for --watch"),
        (["status", "j1", "--watch", "--interval", "0"], "between 1 and 3600"),
        (["status", "j1", "--watch", "--interval", "soon"], "not a number of seconds"),
        (["status", "j1", "--plot", "t.txt"], "--plot: the file's name ends in .png, .svg, .pdf"),
        (["status", "j1", "--plot", "/no/such/dir/t.png"], "no such directory"),
        (["logs", "bad/id"], "job_id"),
        (["logs", "j1", "--since", "yesterday"], "--since: a duration"),
        (["logs", "j1", "--since", "2026-05-01T08:00:00"], "has no time zone"),
        (["logs", "j1", "--attempt", "0"], "--attempt: an attempt's number"),
        (["logs", "j1", "--attempt", "1", "--follow"], "--attempt and --follow"),
        (["logs", "j1", "--interval", "5"], "--interval is for --follow"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    code, lines = _run(None, *argv)  # no invoker: reaching it would fail the test
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and lines == []


def test_since_a_duration_counts_back_from_the_clock():
    args = build_parser().parse_args(["jobs", "logs", "j1", "--since", "90m"])
    jobs_cli.payload(args)
    assert args._since == timedelta(minutes=90)


def test_a_deadline_far_beyond_the_run_is_said_at_the_edge_not_drawn(tmp_path: Path):
    """Issue 45, item 21: a 30 s run with `deadline: 48h` was a mark at the left edge of a two-day axis."""
    from matplotlib import dates as mdates

    a1 = {**attempt(1, FAKE_TASK), "last_status": "STOPPED", "outcome": "succeeded"}
    a1["stopped_at"] = (datetime.fromisoformat(a1["started_at"]) + timedelta(seconds=30)).isoformat()
    far = answer("succeeded", [a1], options={"deadline": (T0 + timedelta(hours=48)).isoformat()})
    drawn = plot_job(far, str(tmp_path / "far.png"))
    (ax,) = drawn.figure.axes
    low, high = (mdates.num2date(x) for x in ax.get_xlim())
    assert (high - low) < timedelta(minutes=10)  # the run fills the axis
    assert drawn.deadline_note is not None and "h after this" in drawn.deadline_note
    near = plot_job(_plotted(), str(tmp_path / "near.png"))  # 6 h after a 3 h run: drawn as a line
    assert near.deadline_note is None
