"""`spotguard explain EVENT_FILE...`: one JSON line per file, saying what SpotGuard would do with it.

Runs the very classifier and planner the interruption function runs; needs no AWS. Exit status 0 when
nothing was rejected, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from spotguard.domain.checkpoints import classify_object_created
from spotguard.domain.interruption.classify import classify, reject
from spotguard.domain.interruption.notices import Decision, planned_actions
from spotguard.domain.settings import RebalanceMode, Settings
from spotguard.domain.tasks import ManageMode


def add_parser(sub: Any) -> None:
    p = sub.add_parser("explain", help="show what SpotGuard would do with events (no AWS needed)")
    p.add_argument(
        "files", nargs="+", metavar="EVENT_FILE", help="EventBridge event JSON files ('-' = stdin)"
    )
    p.add_argument("--clusters", default="", help="watched cluster names, comma-separated (default: all)")
    p.add_argument(
        "--rebalance",
        choices=[m.value for m in RebalanceMode],
        default=RebalanceMode.CHECKPOINT.value,
        help="the stack's RebalanceAction (default: checkpoint)",
    )
    p.add_argument(
        "--manage",
        choices=[m.value for m in ManageMode],
        default=ManageMode.TAGGED.value,
        help="the stack's ManagedTasks (default: tagged)",
    )
    p.set_defaults(run=run)


def describe(name: str, decision: Decision, settings: Settings, manage: ManageMode) -> dict[str, Any]:
    out: dict[str, Any] = {"file": name, "outcome": decision.outcome, "kind": decision.kind}
    ids = decision.instance_ids
    if len(ids) == 1:
        out["instance_id"] = ids[0]
    elif ids:
        out["instance_ids"] = ids
    if decision.task_arn:
        out["task_arn"] = decision.task_arn
    out["event_id"] = decision.event_id
    out["reason"] = decision.reason
    out["actions"] = planned_actions(decision, settings)
    deadlines = sorted({n.deadline.isoformat() for n in decision.notices if n.deadline})
    if deadlines:
        out["deadline"] = deadlines[0]
    if "stop-managed-tasks" in out["actions"] or "signal-managed-tasks-SIGUSR1" in out["actions"]:
        out["managed_tasks"] = "started by SpotGuard, tagged spotguard:managed=true" + (
            ", or any GPU task" if manage is ManageMode.ALL_GPU else ""
        )
    return out


def _read(name: str) -> str | bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    return Path(name).read_bytes()


def _is_s3_event(data: str | bytes) -> bool:
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False  # not JSON, or not an event: the interruption classifier says why
    return isinstance(raw, dict) and raw.get("source") == "aws.s3"


def describe_s3(name: str, data: str | bytes) -> dict[str, Any]:
    """S3 events go to the checkpoints function: explain them with its classifier."""
    e = classify_object_created(data)
    out: dict[str, Any] = {"file": name, "outcome": e.outcome, "kind": "checkpoint-manifest"}
    if e.prefix_uri:
        out["checkpoint_uri"], out["sequence"] = e.prefix_uri, e.sequence
    out.update(event_id=e.event_id, reason=e.reason)
    out["actions"] = ["read-and-validate-manifest", "record-newest-checkpoint"] if e.outcome == "act" else []
    return out


def run(args: argparse.Namespace) -> int:
    settings = Settings(
        clusters=tuple(c.strip() for c in args.clusters.split(",") if c.strip()),
        rebalance=RebalanceMode(args.rebalance),
    )
    manage = ManageMode(args.manage)
    rejected = 0
    for name in args.files:
        try:
            data = _read(name)
        except OSError as exc:
            data, line = (
                b"",
                describe(name, reject(f"cannot read the file: {exc.strerror or exc}"), settings, manage),
            )
        else:
            if _is_s3_event(data):
                line = describe_s3(name, data)
            else:
                line = describe(name, classify(data, settings), settings, manage)
        rejected += line["outcome"] == "reject"
        print(json.dumps(line), flush=True)
    return 1 if rejected else 0
