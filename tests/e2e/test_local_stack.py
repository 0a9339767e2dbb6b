"""The local stack end to end: moto server on 127.0.0.1, every function in this process, the tasks as
real local processes (examples/count.py with the agent), events through EventBridge's rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotguard.adapters import clients
from spotguard_cli.emulator.motoserver import MotoServer
from spotguard_cli.emulator.system import LocalSystem
from tests.conftest import REPO

pytestmark = pytest.mark.slow
COUNT = REPO / "examples" / "count.py"


@pytest.fixture(scope="module")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """One moto server for the module: a new one spends seconds loading each service on its first call.
    Each test starts from a reset server, so no test sees another's resources."""
    with MotoServer(log_path=str(tmp_path_factory.mktemp("moto") / "moto.log")) as moto:
        yield moto


@pytest.fixture
def system(moto_server: MotoServer, tmp_path: Path) -> Iterator[LocalSystem]:
    saved = dict(os.environ)
    moto_server.reset()
    local = LocalSystem(moto_server.endpoint, tmp_path, reconcile_every=3600)
    try:
        yield local
    finally:
        local.close()
        clients.reset()
        os.environ.clear()
        os.environ.update(saved)


def _submit(system: LocalSystem, tmp_path: Path, steps: int = 40, job_id: str = "count") -> dict:
    td = system.task_definition(
        [sys.executable, str(COUNT), "--steps", str(steps), "--out", str(tmp_path / f"{job_id}.json")],
        environment={"SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS": "0.3"},
    )
    answer = system.invoke_jobs(
        {"action": "submit", "job_id": job_id, "request": {"cluster": "gpu-spot", "taskDefinition": td}}
    )
    assert answer["ok"], answer
    return answer["job"]


def _steps_run(system: LocalSystem, task_arn: str) -> int:
    log = system.log_dir / f"task-{task_arn.rsplit('/', 1)[-1][:8]}.log"
    return log.read_text().count(" done\n") if log.exists() else 0


def _status(system: LocalSystem, job_id: str = "count") -> dict:
    return system.invoke_jobs({"action": "status", "job_id": job_id})["job"]


def test_two_interruptions_in_a_row_and_no_step_lost(system: LocalSystem, tmp_path: Path):
    a, b, c = (system.add_host("g5.xlarge", z) for z in ("us-east-1a", "us-east-1b", "us-east-1c"))
    job = _submit(system, tmp_path, steps=60)
    for host, n in ((a, 1), (b, 2)):
        assert system.run_until(lambda n=n: len(_status(system)["attempts"]) == n, timeout=60)
        arn = _status(system)["attempts"][-1]["task_arn"]
        assert system.run_until(lambda arn=arn: _steps_run(system, arn) >= 10, timeout=60)
        system.notice("spot-interruption", host.instance_id)
    assert system.run_until(lambda: system.job_state(job["job_id"]) == "succeeded", timeout=120)
    status = _status(system)
    assert [x["instance_id"] for x in status["attempts"]] == [a.instance_id, b.instance_id, c.instance_id]
    assert [x["outcome"] for x in status["attempts"]] == ["resubmit", "resubmit", "succeeded"]
    result = json.loads((tmp_path / "count.json").read_text())
    assert result["next"] == 60 and sum(result["ran"].values()) == 60  # every step ran exactly once
    assert sorted(result["ran"]) == ["1", "2", "3"]
    assert not any(system.dead_letters().values())


def test_a_notice_for_an_instance_with_no_managed_task(system: LocalSystem, tmp_path: Path):
    a, idle = system.add_host("g5.xlarge", "us-east-1a"), system.add_host("g5.xlarge", "us-east-1b")
    job = _submit(system, tmp_path, steps=20)
    system.notice("spot-interruption", idle.instance_id)
    assert system.run_until(lambda: system.job_state(job["job_id"]) == "succeeded", timeout=60)
    # the notice's batch may still be in flight (pollers hand batches to concurrent invocations)
    assert system.run_until(lambda: system.cluster.describe_host(idle)["status"] == "DRAINING", timeout=30)
    status = _status(system)
    assert len(status["attempts"]) == 1 and status["attempts"][0]["instance_id"] == a.instance_id
    assert len(system.scheduler.requests) == 1


def test_a_duplicate_warning_stops_and_resubmits_once(system: LocalSystem, tmp_path: Path):
    a = system.add_host("g5.xlarge", "us-east-1a")
    system.add_host("g5.xlarge", "us-east-1b")
    job = _submit(system, tmp_path, steps=40)
    arn = job["task_arn"]
    assert system.run_until(lambda: _steps_run(system, arn) >= 5, timeout=60)
    warning = system.notice("spot-interruption", a.instance_id)
    system.put(warning)  # at-least-once delivery: the very same event again
    system.notice("instance-state-change", a.instance_id, state="shutting-down")  # and the second source
    assert system.run_until(lambda: system.job_state(job["job_id"]) == "succeeded", timeout=90)
    assert len(system.scheduler.requests) == 2  # one resubmission
    assert json.loads((tmp_path / "count.json").read_text())["next"] == 40


def test_a_lifecycle_action_is_held_until_the_task_has_stopped(system: LocalSystem, tmp_path: Path):
    a = system.add_host("g5.xlarge", "us-east-1a")
    system.add_host("g5.xlarge", "us-east-1b")
    job = _submit(system, tmp_path, steps=40)
    assert system.run_until(lambda: _steps_run(system, job["task_arn"]) >= 5, timeout=60)
    system.notice("lifecycle-terminate", a.instance_id)
    assert system.run_until(
        lambda: ("CompleteLifecycleAction", a.instance_id, "CONTINUE") in system.lifecycle_calls, timeout=60
    )
    assert ("RecordLifecycleActionHeartbeat", a.instance_id, "") in system.lifecycle_calls
    # completed only after the task had stopped: by then the job had its second attempt
    assert system.runner.finished.get(job["task_arn"]) == 75
    assert system.run_until(lambda: system.job_state(job["job_id"]) == "succeeded", timeout=90)


def test_the_demo_as_a_user_runs_it_and_no_process_is_left(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spotguard_cli.main",
            "local",
            "demo",
            "--json",
            "--steps",
            "30",
            "--interrupt-at",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # its .local-stack goes here
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and all(p["passed"] for p in result["proof"])
    assert result["facts"]["steps_lost"] == 0
    assert (tmp_path / result["facts"]["timeline_png"]).stat().st_size > 0  # its picture, every attempt a bar
    for pid in result["facts"]["pids"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # moto server, every task, the reference run: all gone


def test_up_inject_and_ctrl_c_leave_nothing_behind(tmp_path: Path):
    import signal
    import threading
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    cli = [sys.executable, "-m", "spotguard_cli.main", "local"]
    up = subprocess.Popen(
        [*cli, "up", "--instances", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines: list[bytes] = []  # what `up` prints, as it prints it

    def read() -> None:
        for line in up.stdout or []:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    state_file = tmp_path / ".local-stack" / "up.json"
    try:
        deadline = time.monotonic() + 120
        while not state_file.exists() and time.monotonic() < deadline and up.poll() is None:
            time.sleep(0.2)
        assert state_file.exists(), b"".join(lines).decode()
        state = json.loads(state_file.read_text())
        instance = state["instances"][0]
        run = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True}
        bad = subprocess.run([*cli, "inject", "spot-interruption", "--instance", "i-0000"], **run)
        assert bad.returncode == 2 and "not one of the local instances" in bad.stderr
        sent = subprocess.run([*cli, "inject", "spot-interruption", "--instance", instance], **run)
        assert sent.returncode == 0 and "put on the bus" in sent.stdout
        deadline = time.monotonic() + 60  # the running stack picks it up: wait until it says so
        while not any(b"-> DRAINING" in x for x in lines) and time.monotonic() < deadline:
            if up.poll() is not None:
                break
            time.sleep(0.1)
        assert state["capacity_providers"] == ["gpu-od", "gpu-spot-a", "gpu-spot-b"]
        unknown = subprocess.run([*cli, "inject", "capacity-shortage", "--pool", "nope"], **run)
        assert unknown.returncode == 2 and "one of the local pools" in unknown.stderr
        short = subprocess.run(
            [*cli, "inject", "capacity-shortage", "--pool", "gpu-spot-b", "--for", "2"], **run
        )
        assert short.returncode == 0, short.stderr
        deadline = time.monotonic() + 60  # taken, then over: Auto Scaling launches an instance again
        while not any(b"gpu-spot-b: capacity is back" in x for x in lines) and time.monotonic() < deadline:
            if up.poll() is not None:
                break
            time.sleep(0.1)
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        reader.join(timeout=10)
    text = b"".join(lines).decode()
    assert up.returncode == 0, text
    assert "-> DRAINING" in text and "stopped: moto server and every task process." in text
    assert "gpu-spot-b: no capacity for 2 s (injected)" in text and "gpu-spot-b: capacity is back" in text
    assert not state_file.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(state["moto_pid"], 0)


@pytest.mark.alone
def test_the_capacity_scenario_as_a_user_runs_it(tmp_path: Path):
    """`spotguard local demo --scenario capacity`: spot in one pool, then the other, on-demand when both
    run dry, moved back to spot when capacity returns, finished by the deadline with nothing lost."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    argv = [sys.executable, "-m", "spotguard_cli.main", "local", "demo", "--scenario", "capacity", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    if proc.returncode != 0:
        # Its clock is the wall clock x60: the machine's own delays count as SpotGuard's time, and a
        # slow moment can eat the slack a step of the story needs. Said, and run once more (as .ci/run
        # does); until the local stack runs on a virtual clock (issue 35), two failures fail the test.
        warnings.warn(f"the capacity scenario failed once, run again: {proc.stdout[-1500:]}", stacklevel=1)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and all(p["passed"] for p in result["proof"]), result["proof"]
    markets = [m for m, _ in result["facts"]["attempts"]]
    assert markets[:3] == ["spot", "spot", "on-demand"] and markets[-1] == "spot"
    assert {d["placement"] for d in result["decisions"]} >= {"spot", "on-demand"}
    assert (tmp_path / result["facts"]["timeline_png"]).stat().st_size > 0
    for pid in result["facts"]["pids"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
