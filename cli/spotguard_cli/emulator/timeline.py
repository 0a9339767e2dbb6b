"""A timeline of what happened, in seconds since a moment (the warning), for the local demo; and botocore
hooks that write SpotGuard's own AWS calls into it (drain, RunTask and what it placed, StopTask, SSM,
commits). The lines are made by the small functions here, each a sentence a reader can follow."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol


class Lines(Protocol):
    def add(self, what: str) -> None: ...


class Timeline:
    """What happened, in order; shown as seconds since the warning (negative = set-up before it)."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self._rows: list[tuple[float, str]] = []

    def mark_zero(self) -> None:
        self.t0 = time.monotonic()

    def add(self, what: str) -> None:
        self._rows.append((time.monotonic(), what))

    @property
    def rows(self) -> list[tuple[float, str]]:
        zero = self.t0 if self.t0 is not None else (self._rows[0][0] if self._rows else 0.0)
        return [(t - zero, w) for t, w in self._rows]


# ------------------------------------------------------------------------------------------- phrases
_MANIFEST = re.compile(r"/checkpoints/0*(\d+)/MANIFEST\.json$")
_REPEAT = re.compile(r"([^:]+): \1: ")


def checkpoint_name(uri: str | None) -> str:
    """'checkpoint 15' for a manifest URI of SpotGuard's layout; 'scratch' for none."""
    if not uri:
        return "scratch"
    m = _MANIFEST.search(uri)
    return f"checkpoint {m.group(1)}" if m else uri


def without_repeats(text: str) -> str:
    """A phrase said twice in a row said once: 'to spot in P: spot in P: the plan' -> 'to spot in P:
    the plan' (a move's reason starts with where it goes, which the sentence around it says already)."""
    return _REPEAT.sub(r"\1: ", text)


# the reconcile function's counts that say it did something, in words (`checked` and `pools`, the
# jobs looked at and the pools discovered, it says every time)
RECONCILE_WORDS = {
    "relaunched": "relaunched a stuck launch",
    "stops_applied": "applied a stop whose event was lost",
    "vanished": "found a task gone from ECS",
    "snapshots_settled": "settled a stuck snapshot",
    "unreadable": "found an unreadable job record",
    "failed": "failed on a job",
    "discovery_errors": "could not read part of a cluster's pools",
    "provisioning_abandoned": "gave up on a task waiting for an instance",
    "moves_started": "started a move (asked for a checkpoint)",
    "moves_stopped": "stopped a task to move it (its checkpoint committed)",
    "moves_stop_retried": "tried a move's stop again",
    "moves_abandoned": "abandoned a move (no checkpoint came)",
    "spares_given_back": "gave back a spare instance no attempt needed",
    "gangs_abandoned": "gave up a gang that did not form in time",
    "gang_nodes_launched": "launched a gang's other nodes",
    "gang_stragglers_stopped": "stopped a gang's nodes still running after another stopped",
    "gang_stops_retried": "asked a gang's nodes to stop again (a stop that did not take)",
    "cancel_stops_retried": "asked a cancelled job's task to stop again (a stop that did not take)",
    "runs_applied": "applied a task's start whose RUNNING event was lost",
}
QUIET = ("checked", "pools")


def reconcile_line(counts: Mapping[str, Any]) -> str | None:
    """One line for a reconcile run that did something; None for one that only looked."""
    done = []
    for key, n in counts.items():
        if key in QUIET or not n:
            continue
        words = RECONCILE_WORDS.get(key, key.replace("_", " "))
        done.append(words if n == 1 else f"{words} (x{n})")
    return f"  reconcile: {'; '.join(done)}" if done else None


def runtask_line(params: Mapping[str, Any]) -> str:
    env = {
        e["name"]: e["value"]
        for c in (params.get("overrides") or {}).get("containerOverrides") or []
        for e in c.get("environment") or []
    }
    where = [p.get("capacityProvider") for p in params.get("capacityProviderStrategy") or []]
    pool = f" in {', '.join(w for w in where if w)}" if any(where) else ""
    attempt = env.get("SPOTGUARD_ATTEMPT", "?")
    nodes = env.get("SPOTGUARD_NODES", "")
    node = f" node {env.get('SPOTGUARD_NODE_RANK', '?')} of {nodes}" if nodes not in ("", "1") else ""
    beside = [
        c["expression"].removeprefix("ec2InstanceId !in ")
        for c in params.get("placementConstraints") or []
        if node and str(c.get("expression", "")).startswith("ec2InstanceId !in ")
    ]
    off = f" off {beside[0]}" if beside else ""
    return (
        f"  RunTask attempt {attempt}{node}{pool}{off} from "
        f"{checkpoint_name(env.get('SPOTGUARD_RESUME_FROM'))}"
    )


FAILURE_WORDS = {"RESOURCE:GPU": "no instance with a free GPU"}


def runtask_outcome_line(params: Mapping[str, Any] | None, parsed: Mapping[str, Any]) -> str | None:
    """A RunTask that placed no task, and why (ECS's failure reasons); None when it placed one."""
    if parsed.get("tasks"):
        return None
    reasons = [str(f.get("reason") or "?") for f in parsed.get("failures") or []] or ["no reason given"]
    said = ", ".join(f"{r} ({FAILURE_WORDS[r]})" if r in FAILURE_WORDS else r for r in reasons)
    where = [p.get("capacityProvider") for p in (params or {}).get("capacityProviderStrategy") or []]
    pool = f" in {', '.join(w for w in where if w)}" if any(where) else ""
    env = {
        e["name"]: e["value"]
        for c in ((params or {}).get("overrides") or {}).get("containerOverrides") or []
        for e in c.get("environment") or []
    }
    if env.get("SPOTGUARD_NODE_RANK", "0") != "0":  # a gang's later node: the gang did not form
        return f"  RunTask placed no task{pool} for node {env['SPOTGUARD_NODE_RANK']}: {said}"
    return f"  RunTask placed no task{pool}: {said}; SpotGuard places the launch again"


def signal_line(params: Mapping[str, Any]) -> str:
    """What SpotGuard's SSM document was asked to signal, and where."""
    p = params.get("Parameters") or {}
    sig = (p.get("signal") or ["a signal"])[0]
    ids = [i[:12] for i in " ".join(p.get("containerIds") or []).split()]
    pairs = [pair.partition("=") for pair in " ".join(p.get("taskContainers") or []).split()]
    targets = [f"container {i}" for i in ids] + [
        f"container {name} of task {arn.rsplit('/', 1)[-1][:8]}" for arn, _, name in pairs
    ]
    on = (params.get("InstanceIds") or ["?"])[0]
    return f"  SSM Run Command on {on}: {sig} to {', '.join(targets) or 'no container named'}"


def stop_line(params: Mapping[str, Any]) -> str:
    task = str(params.get("task", "?")).rsplit("/", 1)[-1][:8]
    return f"  StopTask {task}…  reason: {without_repeats(str(params.get('reason') or 'none given'))}"


# --------------------------------------------------------------------------------------------- hooks
def call_recorder(timeline: Lines, calls: list[str]) -> Callable[..., None]:
    """A `before-parameter-build` hook: each of SpotGuard's calls worth a line, as it is made."""
    interesting = {"UpdateContainerInstancesState", "StopTask", "SendCommand", "CompleteLifecycleAction"}

    def hook(model: Any, params: dict[str, Any], context: dict[str, Any] | None = None, **_: Any) -> None:
        calls.append(model.name)
        if model.name == "RunTask":
            if context is not None:
                context["spotguard_runtask"] = dict(params)  # for the answer's line (runtask_recorder)
            timeline.add(runtask_line(params))
        elif model.name == "PutItem" and params.get("Item", {}).get("sk", {}).get("S") == "NEWEST":
            ref = json.loads(params["Item"]["ref"]["S"])
            counted = f"{'wrapper commit' if ref.get('counts') == 'commits' else 'step'} {ref['step']}"
            timeline.add(f"  checkpoint {ref['sequence']} committed ({counted}, attempt {ref['attempt']})")
        elif model.name == "StopTask":
            timeline.add(stop_line(params))
        elif model.name == "UpdateContainerInstancesState":
            timeline.add(
                f"  drain {params['containerInstances'][0].rsplit('/', 1)[-1][:8]}… -> {params['status']}"
            )
        elif model.name == "SendCommand":
            timeline.add(signal_line(params))
        elif model.name in interesting:
            timeline.add(f"  {model.name}")

    return hook


def runtask_recorder(timeline: Lines) -> Callable[..., None]:
    """An `after-call.ecs.RunTask` hook: a line when a RunTask placed no task, saying why."""

    def hook(parsed: dict[str, Any], context: dict[str, Any] | None = None, **_: Any) -> None:
        line = runtask_outcome_line((context or {}).get("spotguard_runtask"), parsed or {})
        if line is not None:
            timeline.add(line)

    return hook


def record_calls(timeline: Lines, calls: list[str]) -> None:
    """Write SpotGuard's own calls into `timeline` from now on (every client, now and later)."""
    from spotguard.adapters import clients

    clients.on_every_call(call_recorder(timeline, calls))
    clients.on_event("after-call.ecs.RunTask", runtask_recorder(timeline))
