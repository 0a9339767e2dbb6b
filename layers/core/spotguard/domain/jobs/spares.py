"""The early replacement: the next instance boots while the warned task checkpoints. Pure.

Without it, the next attempt asks for capacity only once the old task has stopped: its pool's capacity
provider then scales the group, and a GPU instance boots and registers with ECS (minutes) before the
task can start. With it (the stack's `SpareCapacityGroups` lists the pool's group), a spot warning or an
Auto Scaling terminate action on a host that runs a job's attempt decides at once where the next attempt
goes (the warned pool avoided, as the stop will), and asks that pool's Auto Scaling group for one more
instance while the warned task checkpoints:

1. `ask_spare`: the job records its `Spare` (the decision, the group) and the effect `RaiseSpare`, in
   one compare-and-set: a warning delivered again, or a second warning for the same host, finds it and
   asks nothing more. At most one spare at a time per attempt, so per task. (With SpareOnRebalance a
   rebalance recommendation asks it, minutes earlier; its warning then finds it held. One given back
   after its bound, because no warning followed, may be asked again by a warning that comes later.)
2. `spare_raised`: what the group answered (raised by one, or not: at its maximum size, not found).
3. The warned attempt stops (exit 75): the job's next launch carries out the spare's decision
   (`carried_spare`; trigger "warning"), so the task lands on the instance asked for.
4. `spare_unneeded` says when the job no longer needs it: the next attempt runs (on the spare or on
   another instance), was placed in another pool, the job ended or was cancelled, or nothing took it
   within `SPARE_BOUND_SECONDS`. `give_back` then asks for `GiveBackSpare`: the use case terminates an
   instance the group added since the spare was asked for that runs no task (and that no other job's
   spare still waits for), and `spare_given_back` records what was done.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.capacity.model import Market
from spotguard.domain.jobs.effects import GiveBackSpare, RaiseSpare, Step
from spotguard.domain.jobs.model import Job, JobState, Spare, bump

# A spare that no attempt took this long after it was asked for is given back. The warned task has long
# stopped by then (a spot instance is reclaimed two minutes after its warning; an Auto Scaling terminate
# action is held for LifecycleWaitSeconds at most, 15 minutes by default) and a GPU instance has booted.
SPARE_BOUND_SECONDS = 1200
RETRY_GIVE_BACK_SECONDS = 120  # a give-back not recorded as done this long after it began is tried again
GIVE_BACK_LIMIT_SECONDS = 2 * SPARE_BOUND_SECONDS  # and no longer than this after the spare was asked
MAX_BEFORE = 500  # the group's instances kept with the spare (ids of ~19 characters: ~10 KB at most)


def ask_spare(
    job: Job,
    notice: str,
    instance_id: str,
    decision: PlacementDecision,
    group: str | None,
    now: datetime,
) -> Step:
    """A warning reached `instance_id`: record the spare for the job's live attempt there and ask for
    it, once. `decision`: where the next attempt goes (the advisor's, the warned pool avoided); `group`:
    its pool's Auto Scaling group if SpotGuard may scale it (None: not listed, or no group)."""
    live = job.live_attempt
    if job.state is not JobState.RUNNING or live is None or live.instance_id != instance_id:
        return Step(note=f"no live attempt of the job runs on {instance_id}")
    spare = job.spare
    if spare is not None and spare.attempt == live.number and spare.holds and spare.notice != notice:
        # the warning after the rebalance recommendation that asked it: the spare is this notice's now,
        # its bound and its decision's age counted from here
        fresh = spare.model_copy(
            update={
                "notice": notice,
                "asked_at": now,
                "decision": spare.decision.model_copy(update={"at": now}),
            }
        )
        return Step(job=bump(job, now, spare=fresh), note=f"attempt {live.number} has its spare already")
    if spare is not None and spare.attempt == live.number and (spare.holds or spare.notice == notice):
        return Step(note=f"attempt {live.number} has its spare already ({spare.state})")
    if spare is not None and (spare.holds or spare.state == "giving-back"):
        # one at a time: the job keeps one spare, and one not given back yet must not be forgotten
        return Step(note=f"the spare of attempt {spare.attempt} is not given back yet ({spare.state})")
    if decision.placement is Market.NONE or not decision.pool:
        return Step(note=f"no spare: the next attempt is not to run at once ({decision.reason})"[:300])
    if group is None:
        return Step(note=f"no spare: SpotGuard may not scale the group of pool {decision.pool}")
    carried = decision.model_copy(update={"trigger": "warning", "at": now})
    spare = Spare(
        attempt=live.number,
        notice=notice,
        instance_id=instance_id,
        decision=carried,
        group=group,
        cluster=job.request.cluster,
        asked_at=now,
    )
    return Step(
        job=bump(job, now, spare=spare),
        effects=[RaiseSpare(attempt=live.number, group=group)],
        note=f"spare asked of {group} for attempt {live.number + 1} in {decision.pool}",
    )


def spare_raised(
    job: Job, attempt: int, raised: bool, before: tuple[str, ...], detail: str, now: datetime
) -> Step:
    """The group's answer to `RaiseSpare`."""
    spare = job.spare
    if spare is None or spare.attempt != attempt or spare.state != "asked":
        return Step(note="the spare moved on meanwhile")
    changed = spare.model_copy(
        update={
            "state": "raised" if raised else "not-raised",
            "before": before[:MAX_BEFORE],
            "detail": detail[:300],
            "ended_at": None if raised else now,
        }
    )
    return Step(job=bump(job, now, spare=changed), note=detail)


def carried_spare(job: Job, attempt: int) -> PlacementDecision | None:
    """The decision the launch after `attempt`'s stop carries out: its spare's, while the spare holds."""
    spare = job.spare
    if spare is None or spare.attempt != attempt or not spare.holds:
        return None
    return spare.decision


def spare_unneeded(job: Job, now: datetime) -> str | None:
    """Why the job no longer needs the spare it holds (None: it still may)."""
    spare = job.spare
    retry = timedelta(seconds=RETRY_GIVE_BACK_SECONDS)
    if spare is not None and spare.state == "giving-back":
        # a give-back that did not finish (its call failed, or what it gives back is not there yet)
        return (spare.detail or "given back") if now - (spare.ended_at or now) >= retry else None
    if spare is None or not spare.holds:
        return None
    if spare.state == "asked":
        # the group is being asked: what it adds is known once it answers (`before`); an ask that never
        # answered (its Lambda died) is ended by `give_back`
        return "its ask did not finish" if now - spare.asked_at >= retry else None
    if job.state.terminal:
        return f"the job {job.state}"
    if job.cancel_requested:
        return "the job is being cancelled"
    later = [a for a in job.attempts if a.number > spare.attempt]
    if later:
        nxt = later[0]
        if nxt.pool and nxt.pool != spare.decision.pool:
            return f"attempt {nxt.number} was placed in {nxt.pool}"
        if nxt.started_at is not None or nxt.last_status in ("RUNNING", "DEACTIVATING", "STOPPING"):
            return f"attempt {nxt.number} runs" + (f" on {nxt.instance_id}" if nxt.instance_id else "")
        if nxt.last_status == "STOPPED":
            return f"attempt {nxt.number} stopped"
        return None  # the next attempt waits for it in its pool (its provisioning timeout bounds that)
    if now - spare.asked_at >= timedelta(seconds=SPARE_BOUND_SECONDS):
        return f"no attempt took it within {SPARE_BOUND_SECONDS // 60} minutes"
    return None


def give_back(job: Job, why: str, now: datetime) -> Step:
    """The job no longer needs its spare: give it back."""
    spare = job.spare
    if spare is None or not (spare.holds or spare.state == "giving-back"):
        return Step(note="no spare to give back")
    if spare.state == "asked":
        # no answer from the group: what it added, if anything, cannot be told from what was there
        # (the group's own scale-in, with ECS managed scaling, removes an idle instance)
        why = f"{why}: nothing known to give back"
        ended = spare.model_copy(update={"state": "not-raised", "detail": why[:300], "ended_at": now})
        return Step(job=bump(job, now, spare=ended), note=why)
    changed = spare.model_copy(update={"state": "giving-back", "detail": why[:300], "ended_at": now})
    effect = GiveBackSpare(
        attempt=spare.attempt, cluster=spare.cluster, group=spare.group, before=spare.before
    )
    return Step(job=bump(job, now, spare=changed), effects=[effect], note=f"spare given back: {why}")


def spare_given_back(
    job: Job, attempt: int, outcome: str, terminated: str | None, now: datetime, final: bool = True
) -> Step:
    """What giving the spare back did: an instance terminated, or none (every instance the group added
    runs a task: kept). Not `final`: nothing to terminate yet (the instance not listed yet, or kept for
    other jobs' spares that still wait): tried again after RETRY_GIVE_BACK_SECONDS, until
    GIVE_BACK_LIMIT_SECONDS after the spare was asked."""
    spare = job.spare
    if spare is None or spare.attempt != attempt or spare.state != "giving-back":
        return Step(note="the spare moved on meanwhile")
    if not final and now - spare.asked_at < timedelta(seconds=GIVE_BACK_LIMIT_SECONDS):
        later = spare.model_copy(update={"ended_at": now})  # the retry counts from this try
        return Step(job=bump(job, now, spare=later), note=f"{outcome}: tried again later")
    if not final:
        outcome = f"{outcome}; given up after {GIVE_BACK_LIMIT_SECONDS // 60} minutes"
    detail = f"{spare.detail}; {outcome}"[:300]
    changed = spare.model_copy(
        update={"state": "given-back" if terminated else "kept", "detail": detail, "ended_at": now}
    )
    return Step(job=bump(job, now, spare=changed), note=outcome)
