"""Multi-node jobs (a gang: `options.nodes` tasks of one request, one per instance, docs/jobs.md
"Multi-node jobs"): the gang's own steps, pure. The state machine (transitions.py, endings.py,
launches.py) calls them.

- Forming: node 0 is launched first (the job's launch, as for every job); once it runs, its address is
  known and the other nodes are launched with it (`LaunchPeers`, `peer_launched`). The attempt has
  started when every node runs (`formed_at`). A gang that does not form (a node's RunTask placed
  nothing, or not every node runs within `provisioning_timeout_seconds`) is given up whole
  (`abandon_gang`): its tasks are stopped and it is launched again, an attempt that does not count.
- Ending: one node's stop is everyone's. A node that stopped on a committed checkpoint (exit 75) or
  finished (exit 0) agreed with the others (the agent decides for every rank at once): they stop by
  themselves, and reconcile stops those that do not within `STRAGGLER_SECONDS`. A node that stopped any
  other way (killed, its host gone, a failure) cannot be waited for: the others are stopped at once.
  The attempt ends when its last node has stopped, with one outcome for all (`gang_outcome`), and so the
  job is relaunched once however the nodes' events arrive.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from spotguard.domain.jobs.effects import LaunchPeers, Notify, Step, Stop
from spotguard.domain.jobs.model import (
    Attempt,
    AvoidedPool,
    Job,
    JobState,
    NodeTask,
    cancel_reason,
    replace_attempt,
    revised,
)
from spotguard.domain.jobs.stops import RESUME_ME, SPOTGUARD_REASON, StopVerdict

GANG_STOP_PREFIX = "SpotGuard: gang of job "
# The gang's stop asked this long ago and a node still running: asked again (its StopTask may have failed
# after the job was written, or the Lambda died between the two); as for a move's stop.
STOP_RETRY_SECONDS = 420
# A node that agreed to stop (exit 75 or 0) and the others still running this long after: stopped.
# Longer than ECS's longest stopTimeout (120 s), so a commit in progress on the others is not cut.
STRAGGLER_SECONDS = 180
KEEP_GANGS_WHOLE = 1  # ended gangs whose every node's record is kept (older ones: domain.jobs.gangs.compact)
# The reasons domain.jobs.stops gives a task lost with its instance (not one that stopped on a checkpoint)
_LOST_REASONS = ("ECS stopCode", "the host went away", "the task vanished", "stopped by SpotGuard for")


def gang_stop_reason(job: Job, why: str) -> str:
    return f"{GANG_STOP_PREFIX}{job.job_id}: {why}"[:255]


def live_tasks(attempt: Attempt) -> list[NodeTask]:
    return [t for t in attempt.tasks if not t.stopped]


def stops(job: Job, attempt: Attempt, reason: str, but: NodeTask | None = None) -> list[Stop]:
    """StopTask for every task of the attempt still running (but `but`)."""
    return [
        Stop(cluster=job.request.cluster, task_arn=t.task_arn, reason=reason)
        for t in live_tasks(attempt)
        if but is None or t.task_arn != but.task_arn
    ]


def node_stopping(job: Job, attempt: Attempt, task: NodeTask, reason: str, now: datetime) -> list[Stop]:
    """A node of the running gang is being stopped by SpotGuard for its instance (a spot warning, a
    terminate action, maintenance: `reason`, SpotGuard's stop reason): every other node is stopped now
    too, so that all of them checkpoint together on the warning's time rather than each find out when its
    peer is gone. Nothing when the gang's stop was asked already (a cancel, a move, an earlier node)."""
    if (
        attempt.gang_stopped_at is not None
        or job.cancel_requested
        or job.move is not None
        or not reason.startswith(SPOTGUARD_REASON)
        or reason.startswith(GANG_STOP_PREFIX)
    ):
        return []
    why = f"node {task.node}'s instance is going ({reason.removeprefix(SPOTGUARD_REASON)})"
    return stops(job, attempt, gang_stop_reason(job, why), but=task)


def progress(job: Job, before: Attempt, attempt: Attempt, now: datetime) -> tuple[Attempt, list[LaunchPeers]]:
    """A running gang's task moved on (not to STOPPED): node 0 running -> launch the others; every node
    running -> the attempt has started."""
    if job.state is not JobState.RUNNING or attempt.abandoned or attempt.gang_stopped_at or attempt.formed:
        return attempt, []
    tasks = attempt.tasks
    if len(tasks) == attempt.nodes and all(t.last_status == "RUNNING" for t in tasks):
        return revised(attempt, formed_at=now), []
    if attempt.last_status == "RUNNING" and before.last_status != "RUNNING" and missing_nodes(attempt):
        return attempt, [LaunchPeers(attempt=attempt.number)]
    return attempt, []


def missing_nodes(attempt: Attempt) -> list[int]:
    """The nodes of a gang not launched yet."""
    have = {t.node for t in attempt.tasks}
    return [k for k in range(1, attempt.nodes) if k not in have]


def rendezvous(attempt: Attempt) -> str | None:
    """Node 0's address, once it runs: where the other nodes find it."""
    return attempt.private_ip if attempt.last_status == "RUNNING" else None


def peers_wanted(job: Job) -> Attempt | None:
    """The live gang whose node 0 runs and whose other nodes are not all launched (reconcile launches
    them again when the Lambda that was to do it died)."""
    live = job.live_attempt
    if (
        job.state is JobState.RUNNING
        and live is not None
        and live.gang
        and not live.formed
        and not live.abandoned
        and live.gang_stopped_at is None
        and rendezvous(live) is not None
        and missing_nodes(live)
    ):
        return live
    return None


def launch_peers_again(job: Job) -> Step:
    """Reconcile: the gang's other nodes were to be launched once node 0 ran, and are not all there (the
    Lambda that was to launch them died, or node 0's address was not known yet): launch them now."""
    live = peers_wanted(job)
    if live is None:
        return Step(note="no gang waiting for its other nodes")
    return Step(effects=[LaunchPeers(attempt=live.number)])


def peer_launched(job: Job, number: int, node: int, task_arn: str, token: str, now: datetime) -> Step:
    """RunTask answered with node `node`'s task of attempt `number`: record it. A gang that ended or was
    given up meanwhile does not get it: the task is stopped."""
    attempt = next((a for a in job.attempts if a.number == number), None)
    if attempt is not None and attempt.node_task(task_arn) is not None:
        return Step(note="this task is already the gang's node")
    if (
        attempt is None
        or job.state is not JobState.RUNNING
        or not attempt.live
        or attempt.abandoned
        or attempt.gang_stopped_at
        or attempt is not job.attempts[-1]
        or any(t.node == node for t in attempt.peers)
    ):
        reason = gang_stop_reason(job, f"attempt {number} is over; node {node} is not wanted")
        return Step(
            effects=[Stop(cluster=job.request.cluster, task_arn=task_arn, reason=reason)],
            note=f"attempt {number} no longer wants node {node}: stopping its task",
        )
    peer = NodeTask(node=node, task_arn=task_arn, client_token=token, launched_at=now)
    peers = sorted([*attempt.peers, peer], key=lambda p: p.node)
    return Step(job=replace_attempt(job, revised(attempt, peers=peers), now))


def peer_refused(job: Job, number: int, why: str, now: datetime) -> Step:
    """RunTask refused a node's request itself (access, a bad parameter): no retry can help, as for
    node 0's launch (`launches.launch_refused`). The gang's tasks are stopped and the job fails."""
    live = job.live_attempt
    if job.state is not JobState.RUNNING or live is None or live.number != number:
        return Step(note="no gang of that attempt running")
    reason = f"RunTask refused the request: {why}"
    ended = revised(live, gang_stopped_at=now, outcome="failed", outcome_reason=reason[:500])
    failed = replace_attempt(job, ended, now, state=JobState.FAILED, last_reason=reason[:500])
    return Step(
        job=failed,
        effects=[
            *stops(job, live, gang_stop_reason(job, reason)),
            Notify(kind="failed", message=reason[:500]),
        ],
    )


NOTHING_TO_ABANDON = "no attempt waiting for an instance"


def abandon_gang(job: Job, number: int, why: str, now: datetime) -> Step:
    """The live gang, attempt `number`, did not form (`why`): stop every task it has, and launch it again
    once they have stopped, an attempt that does not count (`gang_outcome`). Nothing when the live
    attempt is another (the caller's look at the job was older than a relaunch)."""
    live = job.live_attempt
    if (
        job.state is not JobState.RUNNING
        or live is None
        or live.number != number
        or not live.gang
        or live.formed
        or live.abandoned
    ):
        return Step(note=NOTHING_TO_ABANDON)
    given_up = revised(live, abandoned=why[:300], gang_stopped_at=now)
    reason = gang_stop_reason(job, f"attempt {live.number} did not start on all {live.nodes} nodes ({why})")
    return Step(
        job=replace_attempt(job, given_up, now, last_reason=f"gang not formed: {why}"[:500]),
        effects=stops(job, live, reason),
    )


def node_stopped(
    job: Job, attempt: Attempt, task: NodeTask, verdict: StopVerdict, now: datetime
) -> tuple[Attempt, list[Stop]]:
    """One node of the job's running gang stopped, `verdict` what its own stop says: the attempt with
    it recorded, and the other nodes' stops. They are stopped now unless this one agreed to stop (exit 75
    or 0: they stop by themselves) or their stop was asked already. Once no node runs, the attempt ends
    (the caller decides with `gang_outcome`)."""
    task = revised(
        task, verdict=verdict.outcome, verdict_reason=verdict.reason[:500], stopped_at=task.stopped_at or now
    )
    attempt = attempt.with_node(task)
    agreed = verdict.outcome == "succeeded" or verdict.exit_code == RESUME_ME
    if not live_tasks(attempt) or agreed or attempt.gang_stopped_at is not None:
        return attempt, []
    why = f"node {task.node} stopped ({verdict.reason})"
    return revised(attempt, gang_stopped_at=now), stops(job, attempt, gang_stop_reason(job, why))


def stragglers(job: Job, now: datetime) -> Step:
    """Reconcile: nodes still running `STRAGGLER_SECONDS` after another node of their gang stopped on a
    checkpoint or finished (they agreed to stop too, and have not): stopped."""
    live = job.live_attempt
    if job.state is not JobState.RUNNING or live is None or not live.gang or live.gang_stopped_at:
        return Step(note="no gang waiting for its nodes")
    ended = [t.stopped_at for t in live.tasks if t.stopped and t.stopped_at is not None]
    if not ended or (now - min(ended)).total_seconds() <= STRAGGLER_SECONDS:
        return Step(note="no node stopped long enough ago")
    return _stop_the_rest(job, live, f"still running {STRAGGLER_SECONDS} s after another node stopped", now)


def stop_again(job: Job, now: datetime) -> Step:
    """Reconcile: the attempt's stop was asked `STOP_RETRY_SECONDS` ago (a gang's: a lost node, a warning,
    a gang that did not form; any attempt's: a cancel) and tasks still run: StopTask again (on a task
    already stopping it changes nothing). Without it a StopTask that failed after the write would leave
    those tasks billing, and a cancelled job running, for good."""
    live = job.live_attempt
    if job.state is not JobState.RUNNING or live is None or live.gang_stopped_at is None:
        return Step(note="no stop under way")
    if (now - live.gang_stopped_at).total_seconds() <= STOP_RETRY_SECONDS or not live_tasks(live):
        return Step(note="the attempt's stop is recent, or done")
    why = f"still running {STOP_RETRY_SECONDS} s after the stop was asked"
    reason = cancel_reason(job) if job.cancel_requested else gang_stop_reason(job, why)
    return Step(
        job=replace_attempt(job, revised(live, gang_stopped_at=now), now),
        effects=stops(job, live, reason),
    )


def _stop_the_rest(job: Job, live: Attempt, why: str, now: datetime) -> Step:
    """Stop the gang's nodes still running, saying `why`, and note when (the gang's stop is under way)."""
    return Step(
        job=replace_attempt(job, revised(live, gang_stopped_at=now), now),
        effects=stops(job, live, gang_stop_reason(job, why)),
    )


def gang_outcome(attempt: Attempt, cancelled: bool) -> StopVerdict:
    """What a gang's attempt came to once every node has stopped: given up before it formed (a
    resubmit that does not count), cancelled, resubmitted when any node's own stop says so (a failure
    of another node is then most likely the lost peer's), succeeded when every node finished, else
    failed. Nodes SpotGuard stopped because of another say nothing of their own."""
    if attempt.abandoned:
        return StopVerdict(outcome="resubmit", reason=f"the gang did not form: {attempt.abandoned}")
    own = [t for t in attempt.tasks if not (t.stopped_reason or "").startswith(GANG_STOP_PREFIX)]
    own = own or attempt.tasks
    if cancelled or any(t.verdict == "cancelled" for t in own):
        return StopVerdict(outcome="cancelled", reason="cancelled by the user through SpotGuard")
    resubmit = next((t for t in own if t.verdict == "resubmit"), None)
    if resubmit is not None:
        return StopVerdict(outcome="resubmit", reason=f"node {resubmit.node}: {resubmit.verdict_reason}")
    if all(t.verdict == "succeeded" for t in own):  # those stopped after the others finished, too
        return StopVerdict(outcome="succeeded", reason=f"all {attempt.nodes} nodes exited 0")
    failed = next((t for t in own if t.verdict == "failed"), own[0])
    return StopVerdict(outcome="failed", reason=f"node {failed.node}: {failed.verdict_reason}")


def compact(attempts: list[Attempt], keep: int = KEEP_GANGS_WHOLE) -> list[Attempt]:
    """The attempts with every ended gang but the newest `keep` folded: its nodes after the first become
    a count and their price per hour (spend then counts them over node 0's time: a gang's nodes run
    together). A 64-node gang's tasks take about 50 KB of the job's ledger item, which DynamoDB bounds at
    400 KB; node 0 keeps its whole record, and `spotguard jobs status` says how many were folded."""
    ended = [a for a in attempts if a.gang and a.peers and a.outcome is not None]
    fold = {a.number for a in ended[: max(0, len(ended) - keep)]}
    out = []
    for a in attempts:
        if a.number not in fold:
            out.append(a)
            continue
        prices = [p.price_per_hour for p in a.peers]
        price = None if any(p is None for p in prices) else sum(p for p in prices if p is not None)
        out.append(revised(a, peers=[], folded_peers=len(a.peers), folded_price_per_hour=price))
    return out


def unformed_pool(job: Job, attempt: Attempt, now: datetime) -> list[AvoidedPool]:
    """The job's avoided pools with the pool a gang did not form in (node 0's instance type in its zone)
    kept off for `provisioning_timeout_seconds`: without a capacity policy to mark it, node 0 would be
    placed there again first, in a pool that cannot hold the others, and the gang never form."""
    pools = [p for p in job.avoid_pools if p.until > now]
    if not (attempt.instance_type and attempt.availability_zone):
        return pools
    key = (attempt.instance_type, attempt.availability_zone)
    same = [p.until for p in pools if (p.instance_type, p.availability_zone) == key]
    until = max([now + timedelta(seconds=job.options.provisioning_timeout_seconds), *same])
    others = [p for p in pools if (p.instance_type, p.availability_zone) != key]
    return [*others, AvoidedPool(instance_type=key[0], availability_zone=key[1], until=until)]


def unformed_in_a_row(attempts: list[Attempt], folded_tail: int = 0) -> int:
    """How many of the newest attempts in a row were gangs given up before they formed (with the folded
    ones before them, `folded_tail`, when every kept attempt was one)."""
    count = 0
    for a in reversed(attempts):
        if not a.abandoned:
            return count
        count += 1
    return count + folded_tail


def lost_nodes(attempt: Attempt) -> list[NodeTask]:
    """The nodes whose instance went away (a notice, its host gone, ECS's interruption): their
    instances and pool are avoided by the next attempt. Nodes that stopped on a checkpoint because
    another did are not."""
    return [
        t
        for t in attempt.tasks
        if not (t.stopped_reason or "").startswith(GANG_STOP_PREFIX)
        and (
            t.notice is not None
            or (t.stopped_reason or "").startswith(SPOTGUARD_REASON)  # stopped for its instance
            or (t.verdict == "resubmit" and (t.verdict_reason or "").startswith(_LOST_REASONS))
        )
    ]
