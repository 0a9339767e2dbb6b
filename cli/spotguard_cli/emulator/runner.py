"""ECS tasks as local processes, for the local system (system.py).

The runner watches moto's ECS for tasks placed on the simulated GPU instances and plays the ECS agent:
it starts each task's first container command as a local process (its own process group) with the task
definition's environment, the task's overrides, and the local AWS endpoint; StopTask becomes SIGTERM
to that process, as `docker stop` sends it to the container's first process only, and, after the
container's stopTimeout, SIGKILL to its whole process group (every process of the container ends);
SSM's `docker kill --signal=SIG <runtime id>` becomes that signal to that process. Every state change
goes on the bus as the ECS Task State Change event AWS would send (RUNNING with the container's runtime
id, STOPPED with its exit code), so the template's rule routes it to the task-events queue.

Every instance of the local stack is this machine: a node of a multi-node job is told its rendezvous at
node 0's private address (PET_MASTER_ADDR, SPOTGUARD_RENDEZVOUS), which the runner makes 127.0.0.1 in
the process's environment (`rendezvous_here`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from spotguard_cli.emulator.gpucluster import GpuCluster
from spotguard_cli.emulator.inject import put_entry, task_event
from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS


class SimulatedProcess:
    """A container with no process, for load runs: command `["sim:checkpointing", "<seconds>"]` runs
    until SIGTERM, then exits 75 after <seconds> (as the agent does once its checkpoint is committed);
    SIGUSR1 is taken and changes nothing; SIGKILL ends it at once with 137."""

    pid = 0

    def __init__(self, commit_seconds: float) -> None:
        self.commit_seconds = commit_seconds
        self.exit_at: float | None = None
        self.code = 75

    def signal(self, sig: signal.Signals) -> None:
        if sig == signal.SIGTERM and self.exit_at is None:
            self.exit_at = time.monotonic() + self.commit_seconds
        elif sig == signal.SIGKILL:
            self.exit_at, self.code = time.monotonic(), 128 + int(signal.SIGKILL)

    def poll(self) -> int | None:
        return self.code if self.exit_at is not None and time.monotonic() >= self.exit_at else None

    def wait(self, timeout: float | None = None) -> int:
        self.signal(signal.SIGKILL)
        return self.code


@dataclass
class Running:
    task_arn: str
    container: str
    runtime_id: str
    proc: subprocess.Popen[bytes] | SimulatedProcess
    log_path: Path
    stop_timeout: float
    started: float = field(default_factory=time.monotonic)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))  # what the ECS agent reports
    term_sent_at: float | None = None
    killed: bool = False
    version: int = 2
    log: IO[bytes] | None = None


class TaskRunner:
    """Plays the ECS agent of every simulated instance. `poll()` does one round; call it often."""

    def __init__(
        self,
        cluster: GpuCluster,
        events: Any,
        endpoint: str,
        region: str,
        log_dir: Path,
        on_change: Callable[[str], None] = lambda _: None,
        cwd: Path | None = None,
        on_exit: Callable[[str], None] = lambda _: None,
        environment: Callable[[], dict[str, str]] = dict,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        waiting: Callable[[str], bool] = lambda _: False,
    ) -> None:
        self.cluster = cluster
        self.waiting = waiting  # a task PROVISIONING (no instance yet): no agent starts it
        self.clock = clock  # the times the ECS agent reports (the local stack's scaled clock, if any)
        self.environment = environment  # every task's, after its own (the scaled clock), read at its start
        self.ecs = cluster.ecs
        self.events = events
        self.endpoint = endpoint
        self.region = region
        self.log_dir = log_dir
        self.on_change = on_change
        self.cwd = cwd
        self.on_exit = on_exit  # a task's process ended: its GPUs are free
        self.running: dict[str, Running] = {}
        self.finished: dict[str, int] = {}  # task arn -> exit code
        self.containers: dict[str, str] = {}  # task arn -> the container it runs
        self.seen: set[str] = set()
        self.pids: list[int] = []  # every process it started

    # ----------------------------------------------------------------------------------- the loop
    def poll(self) -> None:
        arns = self.ecs.list_tasks(cluster=self.cluster.name, desiredStatus="RUNNING").get("taskArns", [])
        stopping = [a for a in self.running if a not in arns]  # StopTask'ed (moto: desired STOPPED)
        for arn in arns:
            if arn not in self.seen and not self.waiting(arn):
                self.seen.add(arn)
                self._start(arn)
        for arn in stopping:
            self._terminate(self.running[arn])
        for r in list(self.running.values()):
            if (
                r.term_sent_at is not None
                and not r.killed
                and time.monotonic() - r.term_sent_at > r.stop_timeout
            ):
                self._signal(r, signal.SIGKILL)
                r.killed = True
                self.on_change(f"  SIGKILL {_short(r.task_arn)} (stopTimeout {r.stop_timeout:.0f}s passed)")
            code = r.proc.poll()
            if code is not None:
                self._exited(r, code)

    def describe(self, parsed: dict[str, Any]) -> None:
        """DescribeTasks as ECS answers it: a task whose process still runs after StopTask is not
        STOPPED yet (moto says STOPPED at once), and a stopped one shows its process's exit code."""
        for task in parsed.get("tasks") or []:
            arn = task.get("taskArn", "")
            if arn in self.running and task.get("lastStatus") == "STOPPED":
                task["lastStatus"] = "DEACTIVATING"
            elif arn in self.finished:
                for c in task.get("containers") or []:
                    if c.get("name") == self.containers.get(arn):
                        c["exitCode"] = self.finished[arn]

    def signal_by_document(self, parameters: dict[str, list[str]]) -> None:
        """What SpotGuard's SSM document runs on the instance: `docker kill --signal=SIG` for each
        container id, and for each `<task ARN>=<container name>` the container the ECS agent labelled so."""
        sig = (parameters.get("signal") or [""])[0]
        ids = " ".join(parameters.get("containerIds") or []).split()
        pairs = " ".join(parameters.get("taskContainers") or []).split()
        targets = [r for r in self.running.values() if r.runtime_id in ids]
        targets += [
            self.running[arn] for arn, _, _ in (p.partition("=") for p in pairs) if arn in self.running
        ]
        if sig not in ("SIGUSR1", "SIGUSR2", "SIGTERM"):
            return
        for target in targets:
            self._signal(target, getattr(signal, sig))
            self.on_change(f"  {sig} -> {_short(target.task_arn)} (pid {target.proc.pid}) via SSM")

    def kill(self, task_arn: str) -> None:
        """The task's instance is gone: its process ends at once (SIGKILL), as the instance's does."""
        r = self.running.get(task_arn)
        if r is not None and not r.killed:
            self._signal(r, signal.SIGKILL)
            r.killed = True
            self.on_change(f"  SIGKILL {_short(task_arn)}: its instance was taken away")

    def stop_all(self) -> None:
        """Stop every process this runner started (Ctrl-C, the end of a demo): no orphans."""
        for r in list(self.running.values()):
            self._signal(r, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(timeout=5)
            if r.log:
                r.log.close()
        self.running.clear()

    # ----------------------------------------------------------------------------------- internals
    def _start(self, arn: str) -> None:
        task = self.cluster.tasks([arn])[arn]
        td = self.ecs.describe_task_definition(taskDefinition=task["taskDefinitionArn"])["taskDefinition"]
        container = td["containerDefinitions"][0]
        name = container["name"]
        override = next(
            (
                c
                for c in (task.get("overrides") or {}).get("containerOverrides") or []
                if c.get("name") == name
            ),
            {},
        )
        command = override.get("command") or container.get("command")
        if not command:
            self.on_change(f"  task {_short(arn)} has no command to run locally: left PENDING")
            return
        env = {
            **{e["name"]: e.get("value", "") for e in container.get("environment") or []},
            **{e["name"]: e.get("value", "") for e in override.get("environment") or []},
            **local_environment(self.endpoint, self.region),
            **self.environment(),
        }
        env, rendezvous = rendezvous_here(env)
        log_path = self.log_dir / f"task-{_short(arn)}.log"
        log: IO[bytes] | None = None
        proc: subprocess.Popen[bytes] | SimulatedProcess
        if str(command[0]).startswith("sim:"):
            proc = SimulatedProcess(float(command[1]) if len(command) > 1 else 0.0)
        else:
            log = log_path.open("ab")
            proc = subprocess.Popen(
                [str(c) for c in command],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # its own process group, as a container is
            )
            self.pids.append(proc.pid)
        runtime_id = hashlib.sha256(f"{arn}/{proc.pid}".encode()).hexdigest()
        r = Running(
            task_arn=arn,
            container=name,
            runtime_id=runtime_id,
            proc=proc,
            log_path=log_path,
            stop_timeout=float(container.get("stopTimeout", 30)),
            log=log,
            started_at=self.clock(),
        )
        self.running[arn] = r
        self.containers[arn] = name
        host = task.get("containerInstanceArn", "")
        what = f"pid {proc.pid}" if proc.pid else "a simulated container"
        self.on_change(
            f"  task {_short(arn)}{node_words(env)} started as {what} on {_short(host)} ({log_path.name})"
            + (f"; rendezvous {rendezvous}" if rendezvous else "")
        )
        self._put(task, r, "RUNNING", None)

    def _terminate(self, r: Running) -> None:
        if r.term_sent_at is None and r.proc.poll() is None:
            r.term_sent_at = time.monotonic()
            # ECS says so at once: RUNNING, desired STOPPED, with the stop's reason
            task = self.cluster.tasks([r.task_arn])[r.task_arn]
            self._put(task, r, "RUNNING", None, "UserInitiated", desired="STOPPED")
            self._signal(r, signal.SIGTERM)
            self.on_change(f"  SIGTERM -> {_short(r.task_arn)} (pid {r.proc.pid}): StopTask")

    def _signal(self, r: Running, sig: signal.Signals) -> None:
        if isinstance(r.proc, SimulatedProcess):
            r.proc.signal(sig)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if sig == signal.SIGKILL:  # the container ends: every process in it
                os.killpg(r.proc.pid, sig)
            else:  # docker stop and docker kill --signal reach the container's first process only
                os.kill(r.proc.pid, sig)

    def _exited(self, r: Running, code: int) -> None:
        del self.running[r.task_arn]
        if r.log:
            r.log.close()
        exit_code = code if code >= 0 else 128 - code  # killed by a signal: as Docker reports it
        self.finished[r.task_arn] = exit_code
        self.on_exit(r.task_arn)
        task = self.cluster.tasks([r.task_arn])[r.task_arn]
        if task.get("desiredStatus") != "STOPPED":  # it ended by itself: ECS stops the task
            self.ecs.stop_task(
                cluster=self.cluster.name, task=r.task_arn, reason="Essential container in task exited"
            )
            task = self.cluster.tasks([r.task_arn])[r.task_arn]
        self.on_change(f"  task {_short(r.task_arn)} exited {exit_code}")
        stop_code = "UserInitiated" if r.term_sent_at is not None else "EssentialContainerExited"
        self._put(task, r, "STOPPED", exit_code, stop_code)

    def _put(
        self,
        task: dict[str, Any],
        r: Running,
        status: str,
        exit_code: int | None,
        stop_code: str | None = None,
        desired: str | None = None,
    ) -> None:
        task = {
            **task,
            "lastStatus": status,
            "desiredStatus": desired or ("STOPPED" if status == "STOPPED" else "RUNNING"),
            "startedAt": r.started_at,
        }
        r.version += 1 if status == "STOPPED" or desired else 0
        event = task_event(task, r.version, exit_code=exit_code, stop_code=stop_code, at=self.clock())
        for c in event["detail"]["containers"]:
            if c["name"] == r.container:
                c["runtimeId"] = r.runtime_id
        resp = self.events.put_events(Entries=[put_entry(event)])
        if resp.get("FailedEntryCount"):
            raise RuntimeError(f"EventBridge refused a task event: {json.dumps(resp['Entries'])}")


def local_environment(endpoint: str, region: str) -> dict[str, str]:
    """What a process run as a task here gets besides its own environment: the local AWS endpoint and
    fake credentials, and no instance metadata (SpotGuard's signals only)."""
    return {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH", "TMPDIR")},
        **FAKE_CREDENTIALS,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": region,
        "AWS_EC2_METADATA_DISABLED": "true",
        "SPOTGUARD_WATCH_METADATA": "false",
        "PYTHONUNBUFFERED": "1",
    }


LOOPBACK = "127.0.0.1"
NODE_RANK = "SPOTGUARD_NODE_RANK"
NODES = "SPOTGUARD_NODES"
RENDEZVOUS = "SPOTGUARD_RENDEZVOUS"
MASTER_ADDR = "PET_MASTER_ADDR"  # torchrun's --master-addr, read from its environment


def rendezvous_here(env: dict[str, str]) -> tuple[dict[str, str], str]:
    """The environment with a multi-node job's rendezvous address made 127.0.0.1 (every instance of the
    local stack is this machine: node 0's private address in moto's EC2 leads nowhere), and what was
    changed, in words ('' when nothing was). The port stays: node 0's store listens on it here."""
    out = dict(env)
    host, colon, port = out.get(RENDEZVOUS, "").rpartition(":")
    address = host if colon and host else out.get(MASTER_ADDR, "")
    if not address or address == LOOPBACK:
        return out, ""
    if out.get(MASTER_ADDR):
        out[MASTER_ADDR] = LOOPBACK
    if colon and host:
        out[RENDEZVOUS] = f"{LOOPBACK}:{port}"
    port = port or out.get("PET_MASTER_PORT", "")
    at = f":{port}" if port else ""
    return out, f"{address}{at} is {LOOPBACK}{at} here (every instance is this machine)"


def node_words(env: dict[str, str]) -> str:
    """' (node 1 of 2)' for a task of a multi-node job; '' for any other."""
    rank, nodes = env.get(NODE_RANK, ""), env.get(NODES, "")
    return f" (node {rank} of {nodes})" if rank and nodes and nodes != "1" else ""


def _short(arn: str) -> str:
    return arn.rsplit("/", 1)[-1][:8] if arn else "-"
