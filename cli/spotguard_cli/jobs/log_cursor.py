"""Reading an attempt's log events: each stream from where the last read stopped, merged in time order,
and each event's line.

Events are read with FilterLogEvents, a stream at a time, and a task's containers interleaved in time
order, each line then named by its container.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from spotguard_cli.jobs.log_streams import AttemptLogs, ClientFactory, Stream, fatal_if_unreachable

LOOKBACK_MS = 10_000  # a poll reads again this far before the newest event seen (late ingestion)


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
            fatal_if_unreachable(exc)
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
