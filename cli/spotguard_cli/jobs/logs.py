"""`spotguard jobs logs JOB [--follow]`: a job's container logs over all its attempts, in order.

Where an attempt's logs are: its task's task definition (DescribeTasks gives the task's own revision;
a task ECS no longer knows, stopped more than about an hour ago, is read through the job request's task
definition) names each container's awslogs group and stream prefix, and the stream is
`prefix/container/task-id` (without a prefix, ECS on EC2 names it after the Docker container's id, the
task's `runtimeId`). Events are read with FilterLogEvents, a stream at a time, and a task's containers
interleaved in time order, each line then named by its container.

Between two attempts one line says why the first stopped (an interruption and its kind, a move, an
error, exit codes) and where the next resumed (its checkpoint's sequence and step). `--follow` polls the
newest attempt's streams and the job's status, picks up each new attempt, and returns 0 once the job
has ended; Ctrl-C returns 130 without a traceback.
"""

from __future__ import annotations

import heapq
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from spotguard.domain.jobs.model import TERMINAL  # a job's states once it has ended
from spotguard_cli.answers import (
    AnswerError,
    AttemptView,
    CheckpointView,
    NodeView,
    RequestView,
    StatusView,
    read_answer,
)
from spotguard_cli.clock import Clock

ClientFactory = Callable[[str, "str | None"], Any]  # (service, region or None) -> a boto3 client
Fetch = Callable[[], dict[str, Any]]  # the jobs function's status answer

LOOKBACK_MS = 10_000  # a poll reads again this far before the newest event seen (late ingestion)
FINAL_GRACE_S = 2.0  # the job ended: read once more after this (the log driver's last flush)
MAX_POLL_FAILURES = 5  # status or log reads failing this many polls in a row: give up (exit 1)


class Fatal(Exception):
    """An error no later attempt or poll would get past (no credentials, no endpoint): one line, exit 1."""


class Unreachable(Exception):
    """The jobs function could not be asked (once: exit 1; while following: tried again)."""


# ------------------------------------------------------------------------------------------ streams
@dataclass(frozen=True)
class Stream:
    container: str
    group: str
    name: str
    region: str | None
    node: int | None = None  # a multi-node job's node whose task this is (None: a one-node job's)


@dataclass
class AttemptLogs:
    """Where one attempt's logs are, and what could not be found (said in `notes`, a line each)."""

    number: int
    task_arn: str
    tasks: tuple[str, ...] = ()  # every task resolved (a gang's nodes): one launched later is resolved again
    streams: list[Stream] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pending: bool = False  # a stream named after a container not started yet: resolved again later
    failed: bool = False  # an AWS error, not a configuration without awslogs


def task_id(arn: str) -> str:
    return arn.rsplit("/", 1)[-1]


def _arn_region(arn: str) -> str | None:
    parts = arn.split(":")
    return parts[3] or None if len(parts) > 5 and parts[0] == "arn" else None


def _has_revision(td: str) -> bool:
    return bool(re.search(r":\d+$", td))


def _aws_error(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        return f"{err.get('Code', type(exc).__name__)}: {err.get('Message', '')}".strip()
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _fatal_if_unreachable(exc: Exception) -> None:
    from botocore.exceptions import BotoCoreError

    if isinstance(exc, BotoCoreError):
        raise Fatal(_aws_error(exc)) from exc


class Resolver:
    """Finds the streams of a job's attempts: DescribeTasks (batched, cached), DescribeTaskDefinition
    (cached per revision)."""

    def __init__(self, aws: ClientFactory, request: RequestView) -> None:
        self.aws = aws
        self.cluster = request.cluster or "default"
        self.request_td = request.taskDefinition
        self._tasks: dict[str, dict[str, Any]] = {}
        self._described: set[str] = set()
        self._tds: dict[str, dict[str, Any]] = {}

    def describe(self, arns: Iterable[str], again: bool = False) -> None:
        todo = [a for a in dict.fromkeys(arns) if again or a not in self._described]
        for region in {_arn_region(a) for a in todo}:
            batch = [a for a in todo if _arn_region(a) == region]
            ecs = self.aws("ecs", region)
            for i in range(0, len(batch), 100):
                try:
                    answer = ecs.describe_tasks(cluster=self.cluster, tasks=batch[i : i + 100])
                except Exception as exc:  # a task not described is read via the request
                    _fatal_if_unreachable(exc)
                    continue
                for t in answer.get("tasks", []):
                    self._tasks[t["taskArn"]] = t
                self._described.update(batch[i : i + 100])

    def _task_definition(self, ref: str, region: str | None) -> dict[str, Any]:
        if ref not in self._tds:
            ecs = self.aws("ecs", region)
            self._tds[ref] = ecs.describe_task_definition(taskDefinition=ref)["taskDefinition"]
        return self._tds[ref]

    def resolve(self, attempt: AttemptView, node: int | None = None) -> AttemptLogs:
        """The attempt's streams: its task's, or every node's of a multi-node job (`node`: that one's
        alone), each stream named by its node."""
        found = AttemptLogs(number=attempt.number, task_arn=attempt.task_arn)
        tasks = [t for t in attempt.tasks if node is None or t.node == node]
        found.tasks = tuple(t.task_arn for t in tasks)
        self.describe(found.tasks, again=attempt.live)
        for t in tasks:
            self._resolve_task(found, t, attempt.gang, attempt.live)
        if attempt.folded_peers and node != 0:
            # an old gang: the ledger keeps node 0's record alone, so the others' streams are not known
            found.notes.append(
                f"attempt {attempt.number}: the records of its other {attempt.folded_peers} node(s) were "
                "folded (an old gang's): their logs cannot be found"
            )
        elif node is not None and not tasks:
            forming = attempt.live and not attempt.abandoned
            launched = "is not launched yet" if forming else "was never launched"
            found.notes.append(f"attempt {attempt.number}: node {node} {launched}")
            found.pending = forming
        return found

    def _resolve_task(self, found: AttemptLogs, node_task: NodeView, gang: bool, live: bool) -> None:
        """One task's streams into `found`. A note about the task definition is said once for the
        attempt (a gang's nodes run the same one); one about the task names its node."""
        n, arn, node = found.number, node_task.task_arn, node_task.node
        who = f"attempt {n} node {node}" if gang else f"attempt {n}"
        task = self._tasks.get(arn)
        ref = str(task["taskDefinitionArn"]) if task else self.request_td
        region = _arn_region(arn)
        notes: list[str] = []
        try:
            td = self._task_definition(ref, region)
        except Exception as exc:  # said in one line; the other attempts go on
            _fatal_if_unreachable(exc)
            notes.append(f"attempt {n}: task definition {ref} could not be read: {_aws_error(exc)}")
            found.failed = True
            _add_notes(found, notes)
            return
        if task is None and not _has_revision(ref):
            notes.append(
                f"{who}: task {task_id(arn)} is no longer known to ECS; reading it through "
                f"{ref}'s latest revision (the attempt may have run an older one)"
            )
        runtime_ids = {str(c.get("name")): c.get("runtimeId") for c in (task or {}).get("containers") or []}
        elsewhere: list[str] = []
        unnamed: list[str] = []  # awslogs without a stream prefix, and no container id known yet
        streams: list[Stream] = []
        pending = False
        for c in td.get("containerDefinitions") or []:
            name = str(c.get("name"))
            conf = c.get("logConfiguration") or {}
            options = conf.get("options") or {}
            if conf.get("logDriver") != "awslogs" or not options.get("awslogs-group"):
                elsewhere.append(f"{name} ({conf.get('logDriver') or 'no log driver'})")
                continue
            prefix = options.get("awslogs-stream-prefix")
            if prefix:
                stream = f"{prefix}/{name}/{task_id(arn)}"
            elif runtime_ids.get(name):
                stream = str(runtime_ids[name])
            else:
                pending = True
                unnamed.append(name)
                continue
            streams.append(
                Stream(
                    name,
                    str(options["awslogs-group"]),
                    stream,
                    options.get("awslogs-region") or region,
                    node if gang else None,
                )
            )
        if elsewhere:
            what = "no container" if not streams and not pending else "not every container"
            notes.append(
                f"attempt {n}: {what} of {td.get('family', ref)}:{td.get('revision', '?')} logs to "
                f"CloudWatch Logs with awslogs ({', '.join(elsewhere)}): nothing to show for "
                f"{'it' if len(elsewhere) == 1 else 'them'}"
            )
        if pending and not live:
            notes.append(
                f"{who}: {', '.join(unnamed)}: awslogs without a stream prefix, and ECS no longer "
                "knows the container ids that name those streams"
            )
            pending = False
        found.streams += streams
        found.pending |= pending
        _add_notes(found, notes)


def _add_notes(found: AttemptLogs, notes: list[str]) -> None:
    found.notes += [note for note in notes if note not in found.notes]


# ------------------------------------------------------------------------------------------- events
class Cursor:
    """Reads an attempt's streams from where the last read stopped (each event once)."""

    def __init__(self, aws: ClientFactory, logs: AttemptLogs, since_ms: int | None = None) -> None:
        self.aws = aws
        self.logs = logs
        self.since_ms = since_ms
        self.last_ms: int | None = None
        self.seen: dict[tuple[str, str, str], int] = {}
        self.missing_groups: set[str] = set()
        self.read_before: set[Stream] = set()

    def read(self) -> Iterator[dict[str, Any]]:
        start = self.since_ms
        if self.last_ms is not None:
            start = max(start or 0, self.last_ms - LOOKBACK_MS)
        # one read per stream, merged by time here: each stream's events come in order, but not every
        # implementation of FilterLogEvents interleaves several streams by time (moto does not). A
        # stream new to this cursor (a gang's node launched after node 0 ran, a container named late)
        # is read from the start: its events before the others' newest were never printed.
        sources = [
            self._stream(s, start if s in self.read_before else self.since_ms) for s in self.logs.streams
        ]
        self.read_before.update(self.logs.streams)
        for ev in heapq.merge(*sources, key=lambda e: e["timestamp"]):
            key = (ev["_group"], ev.get("logStreamName", ""), str(ev.get("eventId", "")))
            if key in self.seen:
                continue
            self.seen[key] = ev["timestamp"]
            self.last_ms = max(self.last_ms or 0, ev["timestamp"])
            yield ev
        if self.last_ms is not None:
            floor = self.last_ms - LOOKBACK_MS
            self.seen = {k: t for k, t in self.seen.items() if t >= floor}

    def _stream(self, stream: Stream, start: int | None) -> Iterator[dict[str, Any]]:
        group = stream.group
        params: dict[str, Any] = {"logGroupName": group, "logStreamNames": [stream.name]}
        if start is not None:
            params["startTime"] = start
        pages = self.aws("logs", stream.region).get_paginator("filter_log_events").paginate(**params)
        try:
            for page in pages:
                for ev in page.get("events", []):
                    yield {**ev, "_group": group, "_container": stream.container, "_node": stream.node}
        except Exception as exc:
            _fatal_if_unreachable(exc)
            if getattr(exc, "response", {}).get("Error", {}).get("Code") == "ResourceNotFoundException":
                self.missing_groups.add(group)  # not created yet (or deleted): no events
                return
            raise


def format_event(ev: dict[str, Any], several: bool, timestamps: bool, nodes: bool = False) -> str:
    """An event's line: named by its container when the task has several, and by its node (`nodes`)
    when several nodes' lines are interleaved."""
    text = str(ev.get("message", "")).rstrip("\n")
    if several:
        text = f"[{ev.get('_container')}] {text}"
    if nodes and ev.get("_node") is not None:
        text = f"[node {ev['_node']}] {text}"
    if timestamps:
        at = datetime.fromtimestamp(ev["timestamp"] / 1000, UTC)
        text = f"{at.isoformat(timespec='milliseconds').replace('+00:00', 'Z')} {text}"
    return text


# ----------------------------------------------------------------------------------- between lines
def _when(at: datetime | None) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S}" if at else "?"


def _duration(a: AttemptView) -> str:
    start, end = a.started_at, a.stopped_at
    if start is None or end is None:
        return ""
    return f" after {duration_text((end - start).total_seconds())}"


def duration_text(seconds: float) -> str:
    """'10s', '4m05s', '45m', '2h03m': seconds under ten minutes, minutes under hours."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    minutes = s // 60
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def why_stopped(a: AttemptView) -> str:
    """Why an attempt stopped, in a phrase: a move, an interruption (its kind), an error, a cancel."""
    reason = a.outcome_reason or ""
    outcome = a.outcome
    by = a.interrupted_by or ""
    if reason.startswith("moved: "):
        what = f"moved by SpotGuard ({reason.removeprefix('moved: ')})"
    elif by:
        parts = by.split("#")
        what = f"interrupted: {parts[0]}" + (f" on {parts[-1]}" if len(parts) == 3 else "")
        if reason and by not in reason and reason != parts[0]:
            what += f" ({reason})"
    elif outcome == "failed":
        what = f"failed: {reason}"
    elif outcome == "cancelled":
        what = "cancelled"
    elif outcome == "succeeded":
        what = "succeeded"
    elif outcome == "resubmit":
        what = f"stopped: {reason}"
    elif a.last_status == "STOPPED":
        what = f"stopped: {a.stopped_reason or a.stop_code or 'no reason given'}"
    else:
        what = f"still {a.last_status or 'running'}"
    codes = a.exit_codes
    extras = []
    if codes:
        extras.append("exit " + ", ".join(f"{k}={'-' if v is None else v}" for k, v in sorted(codes.items())))
    # ECS's stop code of a StopTask is UserInitiated, SpotGuard's too: said so, not as if a user stopped it
    spotguards = a.stop_code == "UserInitiated" and (a.stopped_reason or "").startswith("SpotGuard")
    if a.stop_code and a.stop_code not in what and not spotguards:
        extras.append(a.stop_code)
    return what + (f"; {'; '.join(extras)}" if extras else "")


def where(a: AttemptView) -> str:
    market = a.market or a.lifecycle
    bits = [b for b in (market, a.pool or a.instance_type, None if a.pool else a.availability_zone) if b]
    return f" on {' '.join(bits)}" if bits else ""


def resumed_from(a: AttemptView, before: AttemptView | None, checkpoints: list[CheckpointView]) -> str:
    uri = a.resume_from
    if uri:
        ref = next((c for c in checkpoints if c.manifest_uri == uri), None)
        if ref is None:
            return f"from {uri}"
        return f"from checkpoint #{ref.sequence} ({ref.step_label}, {ref.progress:.0%})"
    if before is not None and before.snapshot_id:
        return f"from EBS snapshot {before.snapshot_id}"
    return "from scratch (no checkpoint)"


def _tasks_text(a: AttemptView) -> str:
    """'task 0123456789ab', or for a multi-node attempt '2 nodes, node 0's task 0123456789ab' (node 0's
    task is the attempt's; the others are launched once it runs)."""
    task = f"task {task_id(a.task_arn)[:12]}"
    return f"{a.nodes} nodes, node 0's {task}" if a.gang else task


def header_line(a: AttemptView, checkpoints: list[CheckpointView]) -> str:
    return (
        f"--- attempt {a.number}: {_tasks_text(a)}{where(a)}, launched "
        f"{_when(a.launched_at)}, {resumed_from(a, None, checkpoints)}"
    )


def between_line(before: AttemptView, after: AttemptView, checkpoints: list[CheckpointView]) -> str:
    stopped = f" at {_when(before.stopped_at)}" if before.stopped_at else ""
    return (
        f"--- attempt {before.number} stopped{stopped}{_duration(before)}: {why_stopped(before)} -> "
        f"attempt {after.number} ({_tasks_text(after)}{where(after)}) resumed "
        f"{resumed_from(after, before, checkpoints)}"
    )


def end_line(job: StatusView) -> str:
    if job.state in TERMINAL:
        return f"--- job {job.job_id} {job.state}: {job.last_reason}".rstrip(": ")
    return f"--- job {job.job_id} is {job.state} ({job.last_reason or 'no reason recorded'})"


# ---------------------------------------------------------------------------------------- the command
@dataclass
class LogsOptions:
    follow: bool = False
    since: datetime | None = None
    attempt: int | None = None
    timestamps: bool = False
    interval: float = 5.0
    as_json: bool = False
    node: int | None = None  # a multi-node job's node to show alone (None: every node's, interleaved)


class LogsCommand:
    def __init__(
        self, fetch: Fetch, aws: ClientFactory, clock: Clock, opts: LogsOptions, out: TextIO, err: TextIO
    ) -> None:
        self.fetch, self.aws, self.clock, self.opts = fetch, aws, clock, opts
        self.out, self.err = out, err
        self.failed = False
        self.read_failures = 0  # log reads failed in a row (while following: up to MAX_POLL_FAILURES)

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def warn(self, line: str) -> None:
        print(f"spotguard jobs logs: {line}", file=self.err, flush=True)

    def note(self, line: str) -> None:
        self.say(json.dumps({"note": line}) if self.opts.as_json else line)

    def _job(self) -> StatusView:
        try:
            answer = self.fetch()
        except Exception as exc:  # no credentials, no such stack, no network: one line
            raise Unreachable(f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc
        try:
            return read_answer(answer).status()
        except AnswerError as exc:  # the function refused (its error), or an answer not read
            raise Fatal(str(exc)) from None

    def run(self) -> int:
        try:
            return self._run()
        except (Fatal, Unreachable) as exc:
            self.warn(str(exc))
            return 1

    def _run(self) -> int:
        job = self._job()
        resolver = Resolver(self.aws, job.request)
        attempts = job.attempts
        if self.opts.attempt is not None:
            chosen = [a for a in attempts if a.number == self.opts.attempt]
            if not chosen:
                raise Fatal(f"job {job.job_id} has no attempt {self.opts.attempt} (it has {len(attempts)})")
            attempts = chosen
        if self.opts.node is not None and self.opts.node >= job.nodes:
            raise Fatal(
                f"job {job.job_id} has {job.nodes} node(s): --node is from 0 to {job.nodes - 1}, "
                f"not {self.opts.node}"
            )
        resolver.describe(t.task_arn for a in attempts for t in a.tasks)
        cursor: Cursor | None = None
        for i, a in enumerate(attempts):
            cursor = self._show_attempt(resolver, job, a, attempts[i - 1] if i else None)
        if not attempts:
            self.note(f"--- job {job.job_id} has no attempt yet ({job.state})")
        if not self.opts.follow or job.state in TERMINAL:
            self.note(end_line(job))
            return 1 if self.failed else 0
        try:
            return self._follow(resolver, job, cursor)
        except KeyboardInterrupt:
            self.warn(f"stopped following job {job.job_id} (it goes on)")
            return 130

    def _show_attempt(
        self, resolver: Resolver, job: StatusView, a: AttemptView, before: AttemptView | None
    ) -> Cursor:
        checkpoints = job.checkpoints
        self.note(between_line(before, a, checkpoints) if before else header_line(a, checkpoints))
        logs = resolver.resolve(a, self.opts.node)
        for note in logs.notes:
            (self.warn if logs.failed else self.note)(note)
        self.failed |= logs.failed
        since_ms = int(self.opts.since.timestamp() * 1000) if self.opts.since else None
        cursor = Cursor(self.aws, logs, since_ms)
        ended = a.stopped_at
        if self.opts.since and ended is not None and ended < self.opts.since:
            return cursor  # over before --since: nothing to read
        self._drain(cursor, live=a.live)
        return cursor

    def _drain(self, cursor: Cursor, live: bool) -> None:
        """Print what is new in the attempt's streams. A read that fails is said in one line: the
        other attempts are read all the same (exit 1 at the end), and a follow tries again."""
        try:
            self._print_events(cursor)
        except (Fatal, KeyboardInterrupt):
            raise
        except Exception as exc:
            self.warn(f"attempt {cursor.logs.number}: logs could not be read: {_aws_error(exc)}")
            self.read_failures += 1
            if not self.opts.follow:
                self.failed = True
            return
        self.read_failures = 0
        if cursor.missing_groups and not live:
            self.note(
                f"attempt {cursor.logs.number}: log group {', '.join(sorted(cursor.missing_groups))} "
                "does not exist (never created, or deleted since)"
            )
            cursor.missing_groups.clear()

    def _print_events(self, cursor: Cursor) -> None:
        several = len({s.container for s in cursor.logs.streams}) > 1
        nodes = self.opts.node is None  # --node K: every line is that node's, none is named
        for ev in cursor.read():
            if self.opts.as_json:
                record = {
                    "attempt": cursor.logs.number,
                    "container": ev.get("_container"),
                    "timestamp": ev["timestamp"],
                    "message": str(ev.get("message", "")).rstrip("\n"),
                }
                if ev.get("_node") is not None:  # a multi-node job's line, with or without --node
                    record["node"] = ev["_node"]
                self.say(json.dumps(record))
            else:
                self.say(format_event(ev, several, self.opts.timestamps, nodes))

    def _follow(self, resolver: Resolver, job: StatusView, cursor: Cursor | None) -> int:
        shown = list(job.attempts)
        failures = 0
        while True:
            self.clock.sleep(self.opts.interval)
            try:
                job = self._job()
                attempts = job.attempts
                if cursor is not None:
                    current = next((a for a in attempts if a.number == cursor.logs.number), None)
                    if current is not None and _unresolved(cursor.logs, current, self.opts.node):
                        cursor.logs = resolver.resolve(current, self.opts.node)  # what was read stays read
                if cursor is not None:
                    self._drain(cursor, live=True)
                for a in attempts[len(shown) :]:
                    cursor = self._show_attempt(resolver, job, a, attempts[len(shown) - 1] if shown else None)
                    shown.append(a)
                failures = 0
            except (Fatal, KeyboardInterrupt):
                raise
            except Exception as exc:  # a poll that failed is tried again
                failures += 1
                why = str(exc) if isinstance(exc, Unreachable) else _aws_error(exc)
                self.warn(f"poll failed ({failures}/{MAX_POLL_FAILURES}): {why}")
                if failures >= MAX_POLL_FAILURES:
                    return 1
                continue
            if self.read_failures >= MAX_POLL_FAILURES:
                self.warn(f"gave up: the logs could not be read {self.read_failures} times in a row")
                return 1
            if job.state in TERMINAL:
                if cursor is not None:
                    self.clock.sleep(FINAL_GRACE_S)
                    self._drain(cursor, live=False)
                self.note(end_line(job))
                return 1 if self.failed else 0


def _unresolved(logs: AttemptLogs, attempt: AttemptView, node: int | None) -> bool:
    """Whether an attempt's streams are to be resolved again: a stream waited for its container's id,
    or a gang's node was launched since (node 0 runs first; the others are launched once it does)."""
    launched = tuple(t.task_arn for t in attempt.tasks if node is None or t.node == node)
    return logs.pending or launched != logs.tasks


def run_logs(
    fetch: Fetch,
    aws: ClientFactory,
    clock: Clock,
    opts: LogsOptions,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    return LogsCommand(fetch, aws, clock, opts, out, err).run()
