"""The early replacement's use case (the domain's steps: domain.jobs.spares): at a warning, each job on the
warned host gets its next pool decided and one instance asked of that pool's group; the spare is given
back when the job no longer needs it.

Raising a group and giving a spare back are read-then-set calls on the group (its desired capacity, its
instances): one holder at a time per group, by a lease in the ledger (`SpareGroupLeases`), so that two
Lambdas never both read N and set N+1 (two spares recorded for one instance), nor a give-back land
between another's read and set (the group one above its size for good).

`Spares.on_warning` is what the task-events function does with a spot warning or an Auto Scaling
terminate action (the same events the interruption function acts on, delivered to the task-events queue
too: the urgent path gains no call). The engine carries out the spare's effects through `Spares.carry`,
and asks `Spares.unneeded` after every change of a job, so a spare is given back with the event that
makes it useless; the reconcile sweep gives back those that no event ended (`SPARE_BOUND_SECONDS`).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from spotguard.domain.jobs.effects import GiveBackSpare, RaiseSpare, Step, Transition
from spotguard.domain.jobs.model import Job, JobState
from spotguard.domain.jobs.spares import ask_spare, give_back, spare_given_back, spare_raised, spare_unneeded
from spotguard.ports import JobRunner, JobStore, LaunchPlacement, SpareCapacity, SpareGroupLeases

if TYPE_CHECKING:
    from spotguard.domain.interruption.notices import Notice

log = logging.getLogger(__name__)
LIVE_STATES = (JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING, JobState.SNAPSHOTTING)
MAX_JOBS_LOOKED_AT = 1000  # per state, when a warning looks for the jobs on its host
# A group's lease: a raise or a give-back takes a second or two of calls; one whose Lambda died frees the
# group after LEASE_SECONDS. Another waits for it up to LEASE_WAIT_SECONDS, then gives up (a raise is not
# made: the relaunch waits for its pool as without a spare; a give-back is tried again later).
LEASE_SECONDS = 30
LEASE_WAIT_SECONDS = 10.0
LEASE_POLL_SECONDS = 0.25


class Spares:
    """The early replacement over a `SpareCapacity` (the pools' Auto Scaling groups), for the groups the
    stack lists (`SpareCapacityGroups`); none listed: nothing is asked, every warning is a no-op."""

    def __init__(
        self,
        capacity: SpareCapacity | None,
        groups: Iterable[str],
        store: JobStore,
        clock: Callable[[], datetime],
        leases: SpareGroupLeases,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.capacity = capacity
        self.groups = frozenset(groups)
        self.store, self.clock = store, clock
        self.leases, self.sleep = leases, sleep

    @property
    def on(self) -> bool:
        return self.capacity is not None and bool(self.groups)

    # ------------------------------------------------------------------------------------ warnings
    def on_warning(self, notice: Notice, engine: JobRunner, placement: LaunchPlacement) -> str:
        """A spot warning or a terminate action for `notice.instance_id`: for each job whose live attempt
        runs there, decide the next attempt's pool and ask its spare. Safe to repeat (a job asks once
        per attempt)."""
        if not self.on:
            return "early replacement is off (the stack lists no SpareCapacityGroups)"
        # One-node jobs: a multi-node job's next attempt needs a whole gang's instances, not one spare
        # (docs/capacity.md, "Early replacement"); its relaunch waits for managed scaling as without.
        jobs = [
            j
            for j in self.store.list(JobState.RUNNING, MAX_JOBS_LOOKED_AT)
            if (a := j.live_attempt) is not None and not a.gang and a.instance_id == notice.instance_id
        ]
        if not jobs:
            return f"no job runs on {notice.instance_id}"
        notes = []
        for job in jobs:
            replacement = placement.replacement(job)
            if replacement is None:
                notes.append(f"{job.job_id}: no capacity decision for it (fixed capacity, or no pools)")
                continue
            decision, group = replacement
            allowed = group if group in self.groups else None
            _, note = engine.run(
                job.job_id,
                lambda j, d=decision, g=allowed: ask_spare(
                    j, notice.event_id, notice.instance_id, d, g, self.clock()
                ),
                current=job,
                drive=False,
            )
            notes.append(f"{job.job_id}: {note}")
        return "; ".join(notes)[:1000]

    # ------------------------------------------------------------------------------------- effects
    def carry(self, job: Job, effect: RaiseSpare | GiveBackSpare) -> list[Transition]:
        """Carry out a spare's effect; the transition that records its outcome."""
        if self.capacity is None:  # the stack lists no groups any more: nothing may be asked or terminated
            why = "the stack lists no SpareCapacityGroups now: left to the group's own scale-in"
            log.warning("job %s: %s", job.job_id, why)
            if isinstance(effect, GiveBackSpare):
                return [lambda j: spare_given_back(j, effect.attempt, why, None, self.clock())]
            return [lambda j: spare_raised(j, effect.attempt, False, (), why, self.clock())]
        owner = secrets.token_hex(8)
        if not self._hold(effect.group, owner):
            busy = f"another spare of {effect.group} is being asked or given back"
            log.warning("job %s: %s for longer than %ss", job.job_id, busy, LEASE_WAIT_SECONDS)
            if isinstance(effect, GiveBackSpare):  # not final: the next change or the sweep tries again
                return [lambda j: spare_given_back(j, effect.attempt, busy, None, self.clock(), False)]
            why = f"not asked: {busy}"
            return [lambda j: spare_raised(j, effect.attempt, False, (), why, self.clock())]
        try:
            if isinstance(effect, RaiseSpare):
                return self._raise(job, effect)
            return self._give_back(job, effect)
        finally:
            self.leases.let_go_group(effect.group, owner)

    def _hold(self, group: str, owner: str) -> bool:
        """The group's lease, waited for up to LEASE_WAIT_SECONDS."""
        waited = 0.0
        while True:
            now = self.clock()
            if self.leases.hold_group(group, owner, now, now + timedelta(seconds=LEASE_SECONDS)):
                return True
            if waited >= LEASE_WAIT_SECONDS:
                return False
            self.sleep(LEASE_POLL_SECONDS)
            waited += LEASE_POLL_SECONDS

    def _raise(self, job: Job, effect: RaiseSpare) -> list[Transition]:
        assert self.capacity is not None
        # asked once (the spare is written before): a failure is recorded, not retried, and the
        # warning's record is not failed for it (the relaunch then waits for the boot, as without)
        try:
            raised, before, detail = self.capacity.raise_one(effect.group)
        except Exception as exc:
            log.warning("job %s: the spare could not be asked of %s", job.job_id, effect.group, exc_info=True)
            said = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, whatever AWS answered
            raised, before, detail = False, (), f"could not be asked: {said}"[:300]
        log.info("job %s: spare for attempt %s: %s", job.job_id, effect.attempt + 1, detail)
        return [lambda j: spare_raised(j, effect.attempt, raised, before, detail, self.clock())]

    def _give_back(self, job: Job, effect: GiveBackSpare) -> list[Transition]:
        assert self.capacity is not None
        try:
            keep = self._others_waiting(job, effect.group)
            terminated, outcome, final = self.capacity.give_back(
                effect.cluster, effect.group, effect.before, keep
            )
        except Exception as exc:
            # not failed for it, whatever the caller was doing (a cancel): the job's next change, or the
            # sweep, tries again once RETRY_GIVE_BACK_SECONDS have passed, up to GIVE_BACK_LIMIT_SECONDS
            log.warning("job %s: the spare could not be given back yet", job.job_id, exc_info=True)
            terminated, final = None, False
            outcome = "could not be given back: " + " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        log.info("job %s: spare given back: %s", job.job_id, outcome)
        return [lambda j: spare_given_back(j, effect.attempt, outcome, terminated, self.clock(), final)]

    def unneeded(self, job: Job) -> Transition | None:
        """The transition that gives the job's spare back, if the job no longer needs it."""
        if spare_unneeded(job, self.clock()) is None:
            return None

        def transition(j: Job) -> Step:
            why = spare_unneeded(j, self.clock())  # on the job as it stands when written
            return give_back(j, why, self.clock()) if why else Step(note="the spare is still needed")

        return transition

    def _others_waiting(self, job: Job, group: str) -> int:
        """Other jobs' spares in `group` that still wait for an instance the group added."""
        now = self.clock()
        return sum(
            1
            for state in LIVE_STATES
            for other in self.store.list(state, MAX_JOBS_LOOKED_AT)
            if other.job_id != job.job_id
            and other.spare is not None
            and other.spare.holds
            and other.spare.group == group
            and spare_unneeded(other, now) is None
        )
