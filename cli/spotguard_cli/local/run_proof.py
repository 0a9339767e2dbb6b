"""The proof of a `spotguard local run` (local/run.py), from the job's status as the CLI reads it, and
its printing: the timeline, each attempt's (each node's) output, the checks, and what is missing when a
check failed for a reason the user can mend."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from spotguard_cli.local.shared import STATE_DIR, first_step, first_step_line

OUTPUT_LINES = 8  # of each attempt's output, printed beside the proof


def formed(attempt: Any, nodes: int) -> bool:
    """Did the attempt run all its nodes together (a one-node attempt: did it start)?"""
    if nodes == 1:
        return attempt.started_at is not None
    return attempt.formed_at is not None and len(attempt.tasks) == nodes


def proved(
    system: Any,
    status: Any,
    warned: tuple[datetime, str],
    timeline: Any,
    work: Path,
    nodes: int = 1,
    wrapped: bool = True,
) -> dict[str, Any]:
    warned_at, warned_instance = warned
    attempts, checkpoints = status.attempts, status.checkpoints
    before_second = [
        c
        for c in checkpoints
        if len(attempts) > 1
        and c.created_at is not None
        and attempts[1].launched_at is not None
        and c.created_at <= attempts[1].launched_at
    ]
    newest = max(before_second, key=lambda c: c.sequence, default=None)
    warned_commit = [
        c for c in checkpoints if c.attempt == 1 and c.created_at is not None and c.created_at >= warned_at
    ]
    lost = (
        (attempts[0].stopped_at - newest.created_at).total_seconds()
        if newest is not None and newest.created_at and attempts[0].stopped_at
        else None
    )
    dead = system.dead_letters()
    proof = [
        ("the job succeeded", status.state == "succeeded"),
        (
            "interrupted once and resumed on the other instance (2 attempts)"
            if nodes == 1
            else "interrupted once and resumed as a whole gang, off the warned instance (2 attempts)",
            len(attempts) == 2 and warned_instance not in {t.instance_id for t in attempts[1].tasks},
        ),
        ("it committed a checkpoint when warned", bool(warned_commit)),
        (
            "the second attempt resumed from the newest committed checkpoint",
            newest is not None and attempts[1].resume_from == newest.manifest_uri,
        ),
        *(
            [(f"each attempt ran its {nodes} nodes together", all(formed(x, nodes) for x in attempts))]
            if nodes > 1
            else []
        ),
        ("nothing in any dead-letter queue", not any(dead.values())),
        ("every AWS call allowed by its function's role", not system.guard.denied),
    ]
    starts = [_started_with(work, status.job_id, x.number) for x in attempts]
    if any(found is not None for found in starts):  # a checkpoint_dir: each container says what it found
        proof.append(
            (
                "each attempt's checkpoint directory held nothing but what SpotGuard restored",
                all(found == [] for found in starts),
            )
        )
    outputs = [
        _output(work, x.number, t.task_arn, t.node if nodes > 1 else None) for x in attempts for t in x.tasks
    ]
    hint = _hint(status.state, len(attempts), newest is not None, nodes, wrapped)
    return {
        "ok": all(p for _, p in proof),
        "hint": hint,
        "timeline": [{"seconds": round(t, 3), "what": w} for t, w in timeline.rows],
        "proof": [{"check": c, "passed": p} for c, p in proof],
        "facts": {
            "job_id": status.job_id,
            "state": status.state,
            "attempts": len(attempts),
            "resumed_from": attempts[1].resume_from if len(attempts) > 1 else None,
            "resumed_at_step": newest.step if newest is not None else None,
            "resumed_at": newest.step_label if newest is not None else None,  # step N | wrapper commit N
            "seconds_lost": lost,
            "dead_letters": dead,
        },
        "output": outputs,
    }


def _hint(state: str, attempts: int, resumed: bool, nodes: int, wrapped: bool) -> str | None:
    """What is missing, when the proof failed for a reason the user can mend."""
    if state == "succeeded" and attempts == 1 and not wrapped:
        # issue 45, item 18: "[ok] the job succeeded" beside "run FAILED", and nothing said why
        return (
            "the command exited 0 after SpotGuard's SIGTERM, so SpotGuard took the job as finished: a "
            "script that saves to a directory needs --checkpoint-dir DIR (the agent's wrapper then commits "
            "DIR and resumes it); one that uses the agent's library exits 75 once its checkpoint is committed"
        )
    if attempts > 1 and not resumed:
        return (
            "the warning came before the job committed any checkpoint (it was still starting: imports, "
            + ("torchrun's rendezvous, " if nodes > 1 else "")
            + "its first steps), so its next attempt started from nothing: give a later --interrupt-at "
            "(SECONDS after it ran, or step:N)"
        )
    return None


def _output(work: Path, number: int, task_arn: str, node: int | None = None) -> dict[str, Any]:
    """An attempt's output: its log, its last lines, and (the agent's library says it after a restore,
    issue 47) its container start to first training step, with the restore's share."""
    log = work / f"task-{task_arn.rsplit('/', 1)[-1][:8]}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    first = first_step(text)
    return {
        "attempt": number,
        "node": node,  # of a multi-node job's attempt; None for a one-node job
        "log": str(log),
        "tail": text.splitlines()[-OUTPUT_LINES:],
        "first_step_seconds": first[0] if first else None,
        "restore_seconds": first[1] if first else None,
    }


def _started_with(work: Path, job_id: str, attempt: int) -> list[str] | None:
    """What the attempt's checkpoint directory held when its container started, before the agent restored
    anything (local/container.py); None without a checkpoint directory (or a record)."""
    from spotguard_cli.local.container import START_RECORD

    base = work / "containers"
    records = [base / f"{job_id}-attempt-{attempt}", *sorted(base.glob(f"{job_id}-attempt-{attempt}-node-*"))]
    found: list[str] | None = None
    for record in (r / START_RECORD for r in records):  # a gang's: every node's
        try:
            found = [*(found or []), *json.loads(record.read_text())["found"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def print_result(result: dict[str, Any]) -> None:
    print("\ntimeline (seconds since the warning was put on the bus):")
    for row in result["timeline"]:
        print(f"  {row['seconds']:+8.3f}s  {row['what']}")
    for out in result["output"]:
        whose = f"attempt {out['attempt']}" + (f" node {out['node']}" if out.get("node") is not None else "")
        print(f"\n{whose}'s output (last lines; all of it in {out['log']}):")
        for line in out["tail"] or ["(no output)"]:
            print(f"  | {line}")
    facts = result["facts"]
    print("\nproof:")
    for p in result["proof"]:
        print(f"  [{'ok' if p['passed'] else 'FAILED'}] {p['check']}")
    for out in result["output"]:
        if out.get("first_step_seconds") is not None:
            print("\n" + first_step_line(out["attempt"], (out["first_step_seconds"], out["restore_seconds"])))
    if facts["resumed_from"]:
        lost = facts["seconds_lost"]
        ran_on = f"; the first attempt stopped {lost:.1f} s after its last commit" if lost is not None else ""
        print(f"\nresumed from {facts['resumed_from']} (its {facts['resumed_at']}){ran_on}")
    print(f"logs: {STATE_DIR / 'run'}/ (functions.log, task-*.log, moto.log)")
    if result.get("hint"):
        print(f"\nwhat is missing: {result['hint']}")
    print("moto server and every task process stopped.\n" + ("run passed" if result["ok"] else "run FAILED"))
