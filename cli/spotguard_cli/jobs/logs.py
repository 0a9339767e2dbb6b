"""`spotguard jobs logs JOB [--follow]`: a job's container logs over all its attempts, in order.

Each attempt's streams are found by `log_streams`, read by `log_cursor`, and introduced by the lines of
`log_lines` (a header, then between two attempts why the first stopped and where the next resumed).
`--follow` polls the newest attempt's streams and the job's status, picks up each new attempt, and
returns 0 once the job has ended; Ctrl-C returns 130 without a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from spotguard.domain.jobs.model import TERMINAL  # a job's states once it has ended
from spotguard_cli.answers import AnswerError, AttemptView, StatusView, read_answer
from spotguard_cli.clock import Clock
from spotguard_cli.jobs.log_cursor import Cursor, format_event
from spotguard_cli.jobs.log_lines import between_line, end_line, header_line
from spotguard_cli.jobs.log_streams import AttemptLogs, ClientFactory, Fatal, Resolver, aws_error

Fetch = Callable[[], dict[str, Any]]  # the jobs function's status answer

FINAL_GRACE_S = 2.0  # the job ended: read once more after this (the log driver's last flush)
MAX_POLL_FAILURES = 5  # status or log reads failing this many polls in a row: give up (exit 1)


class Unreachable(Exception):
    """The jobs function could not be asked (once: exit 1; while following: tried again)."""


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
            self.warn(f"attempt {cursor.logs.number}: logs could not be read: {aws_error(exc)}")
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
                why = str(exc) if isinstance(exc, Unreachable) else aws_error(exc)
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
