"""The live half of a replay on the virtual clock (the default): every function of the stack over moto in
this process, on one virtual clock that jumps from one thing due to the next (emulator/vclock.py), so a
replay takes as long as the work the functions do, not the traces' hours, and the same run repeats
exactly. It is the soak's loop (emulator/soak/) with the replay's world:

- one spot pool per trace (a capacity provider of p3.2xlarge instances in a zone of its own) and an
  on-demand pool that never runs out, each with one instance per job (`world.py`'s pools, the same
  names, prices and answers);
- at each trace tick, a pool whose spot is back gets its instances again (EC2 Instance Launch Successful
  on the bus); one without spot refuses RunTask and says so at every tick (EC2 Instance Launch
  Unsuccessful); the instances of a pool that loses spot at a tick get the interruption warning two
  minutes before it and are taken back at it (a task still there is gone with them);
- the jobs start at the seed's starts (C hours of work, a deadline R hours later); each attempt's task is
  RUNNING as soon as it is placed, pays D hours with no progress (the restart overhead the simulator
  charges every launch), then works in 5-minute steps, commits every 30 minutes, at the step after a
  SIGUSR1 (a move: SpotGuard's SSM command) and 20 seconds after SpotGuard stops it (then exits 75), and
  exits 0 when its C hours are done.

What is not modelled (each a real delay the simulator does not have either, or a fixed one): Lambda's
own durations and cold starts (an invocation takes no virtual time), Auto Scaling's launch time (spot
that is back has its instances at once), and the task's start (ECS's placement to RUNNING: at once; the
image pull and restore are inside D).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotguard_cli.emulator.soak.loop import Soak
from spotguard_cli.emulator.soak.model import START, SoakPlan, Task
from spotguard_cli.local.replay.report import Work
from spotguard_cli.local.replay.schedule import STEP_MINUTES, WARM_UP_HOURS, JobRun
from spotguard_cli.local.replay.world import (
    INSTANCE_TYPE,
    ON_DEMAND,
    WARNING,
    ZONES,
    describe_p3,
    provider_name,
    spot_price_history,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from spotguard_cli.emulator.gpucluster import Host, PoolGroup
    from spotguard_cli.emulator.vclock import VirtualClock
    from spotguard_cli.emulator.world import JobsWorld
    from spotguard_cli.simulator import Job, Prices, Trace

ENDED_CHECK = timedelta(hours=1)  # how often a run with a job that will never succeed asks if all ended


@dataclass
class ReplayTask(Task):
    """A replay's task: the soak's, which hears a move's SIGUSR1."""

    signalled_at: datetime | None = None  # SIGUSR1 (a move's checkpoint) not yet answered by a commit

    def next_step_after(self, when: datetime) -> datetime | None:
        """The end of the first step that ends after `when` (the agent's next step boundary)."""
        start = self.works_from
        if start is None:
            return None
        step = timedelta(minutes=STEP_MINUTES)
        if when < start:
            return start + step
        return start + step * (math.floor((when - start) / step) + 1)


class VirtualReplay(Soak):
    """The soak's loop over the replay's pools and jobs (module docstring)."""

    def __init__(
        self,
        world: JobsWorld,
        clock: VirtualClock,
        traces: list[Trace],
        job: Job,
        starts: list[int],
        end_tick: int,
        prices: Prices,
        say: Callable[[str], None],
    ) -> None:
        gap = timedelta(hours=traces[0].gap_hours)
        hours = (START + gap * end_tick - clock.now()).total_seconds() / 3600
        super().__init__(world, clock, SoakPlan(traces, len(starts), job.hours, hours, len(starts), 0), say)
        self.job, self.prices, self.gap = job, prices, gap
        self.end = START + gap * end_tick
        self.restart = timedelta(seconds=1)  # placed to RUNNING: ECS's own seconds (D is inside the task)
        self.overhead = timedelta(hours=job.restart_hours)
        self.starts = {f"replay-{k + 1}": tick for k, tick in enumerate(starts)}
        self.books = {
            job_id: type(book)(job_id, "", self.at(tick) + timedelta(seconds=1))
            for (job_id, tick), book in zip(self.starts.items(), self.books.values(), strict=True)
        }
        self.next_reconcile = clock.now() + timedelta(minutes=5)
        self.next_ended_check = clock.now()
        self.warned_for = [-1 for _ in traces]  # the tick whose loss each pool was warned of
        self.unsuccessful_tick = [-1 for _ in traces]  # the tick each pool last said it could launch nothing
        self.counts = {"warnings": 0, "taken_away": 0, "launch_failures": 0, "launches": 0}
        self.groups = [
            _group(provider_name(i, t), ZONES[i], spot=True)  # one zone a trace
            for i, t in enumerate(traces)
        ]
        self.on_demand = _group(ON_DEMAND, ZONES[0], spot=False)
        self._build()

    def at(self, tick: int) -> datetime:
        return START + self.gap * tick

    def _build(self) -> None:
        from spotguard.adapters import clients

        self.world.cluster.add_pools(self.world.stack.client("autoscaling"), [*self.groups, self.on_demand])
        clients.on_event(
            "before-call.ec2.DescribeSpotPriceHistory",
            lambda **_: spot_price_history(self.clock.now(), self.prices.spot, len(self.groups)),
        )
        clients.on_event("before-call.ec2.DescribeInstanceTypes", describe_p3)
        clients.on_event("before-call.ssm.SendCommand", self._signalled)
        for _ in range(len(self.starts)):
            self._join(self.on_demand)
        self.world.reconcile()  # SpotGuard discovers the pools before the first tick
        self._drain()

    def _join(self, group: PoolGroup) -> Host:
        """An instance of the group's joins the cluster (and ECS says so on the bus)."""
        from spotguard_cli.emulator.inject import container_instance_event

        cluster = self.world.cluster
        host = cluster.add_host(INSTANCE_TYPE, group.zones[0], group.capacity_provider, spot=group.spot)
        self.world.put(container_instance_event(cluster.describe_host(host), at=self.clock.now()))
        return host

    # ----------------------------------------------------------------------------------- the pools
    def _traces(self, now: datetime) -> None:
        from spotguard_cli.emulator.inject import launch_successful, launch_unsuccessful

        tick = self._tick(now)
        stack = self.world.stack
        for i, trace in enumerate(self.traces):
            group, up = self.groups[i], trace.available[min(tick, len(trace.available) - 1)]
            nxt = tick + 1
            losing = nxt < len(trace.available) and up and not trace.available[nxt]
            if losing and now >= self.at(nxt) - WARNING and self.warned_for[i] != nxt:
                self.warned_for[i] = nxt
                for host in self.pools[i]:  # warned, drained, taken back at the tick
                    self.world.interrupt(host)
                    self.interruptions += 1
                    self.counts["warnings"] += 1
                    self.reclaims.append((self.at(nxt), host))
                    self._note(f"pool {i}: spot warning for {host.instance_id}")
                self.pools[i] = []
            if up and self.available[i] is not True:
                self.world.scheduler.short_providers.discard(group.capacity_provider)
                for _ in range(len(self.starts) - len(self.pools[i])):
                    host = self._join(group)
                    self.pools[i].append(host)
                    self.counts["launches"] += 1
                    self.world.put(
                        launch_successful(
                            group.group, group.zones[0], host.instance_id, now, stack.region, stack.account
                        )
                    )
                    self._note(f"pool {i}: {host.instance_id} joins")
            elif not up:
                self.world.scheduler.short_providers.add(group.capacity_provider)
                self.reclaims += [(now, host) for host in self.pools[i]]  # lost with no warning
                self.pools[i] = []
                if self.unsuccessful_tick[i] != tick:  # a group that keeps trying: once a tick
                    self.unsuccessful_tick[i] = tick
                    self.counts["launch_failures"] += 1
                    self.world.put(
                        launch_unsuccessful(group.group, group.zones[0], now, stack.region, stack.account)
                    )
            self.available[i] = up
        for when, host in [r for r in self.reclaims if r[0] <= now]:
            self.reclaims.remove((when, host))
            for task in self._live_on(host):
                self._exit(task, None, f"Host EC2 (instance {host.instance_id}) terminated.")
            self.world.cluster.remove_host(host)
            self.counts["taken_away"] += 1
            self._note(f"{host.instance_id} taken back")

    # ------------------------------------------------------------------------------------ the jobs
    def _submit(self, now: datetime) -> None:
        for job_id, book in self.books.items():
            if book.submitted or book.submit_at > now:
                continue
            deadline = self.at(self.starts[job_id]) + timedelta(hours=self.job.deadline_hours)
            answer = self.world.invoke(
                {
                    "action": "submit",
                    "job_id": job_id,
                    "request": {"cluster": "gpu-spot", "taskDefinition": self.td},
                    "options": {
                        "deadline": deadline.isoformat(),
                        "work_hours": self.job.hours,
                        "max_attempts": 100,
                    },
                }
            )
            if not answer.get("ok"):
                raise RuntimeError(f"submit {job_id}: {answer}")
            book.submitted, book.checkpoint_uri = True, answer["job"]["checkpoint_uri"]
            self._note(f"{job_id} submitted")

    # ----------------------------------------------------------------------------------- the tasks
    def _placed(self, arn: str, host: str, now: datetime) -> None:
        super()._placed(arn, host, now)
        task = self.tasks.get(arn)
        if task is not None and not isinstance(task, ReplayTask):
            self.tasks[arn] = ReplayTask(**(vars(task) | {"overhead": self.overhead}))
            # ECS's startedAt, which SpotGuard bills the attempt from: RUNNING comes `restart` later
            from moto.ecs.models import ecs_backends

            stack = self.world.stack
            moto_task = ecs_backends[stack.account][stack.region].tasks["gpu-spot"][arn]
            moto_task.started_at = now + self.restart

    def _tasks(self, now: datetime) -> None:
        for task in self.tasks.values():  # a move's SIGUSR1: a commit at the next step boundary
            if not isinstance(task, ReplayTask) or task.signalled_at is None:
                continue
            if task.exited_at is not None or task.stop_asked_at is not None:
                task.signalled_at = None  # the stop's own commit answers it
                continue
            due = task.next_step_after(task.signalled_at)
            if due is not None and now >= due:
                self._commit(task, due)
                task.signalled_at = None
        super()._tasks(now)

    def _signalled(self, params: dict[str, Any], **_: Any) -> None:
        """SpotGuard's SSM command (its signal document) on an instance: SIGUSR1 reaches the tasks named."""
        import json

        body = params.get("body") or b"{}"
        parameters = dict(json.loads(body).get("Parameters") or {})
        if (parameters.get("signal") or [""])[0] != "SIGUSR1":
            return
        for pair in " ".join(parameters.get("taskContainers") or []).split():
            task = self.tasks.get(pair.partition("=")[0])
            if isinstance(task, ReplayTask) and task.exited_at is None and task.signalled_at is None:
                task.signalled_at = self.clock.now()
                self._note(f"{task.arn[-8:]} ({task.job_id}/{task.attempt}) SIGUSR1")

    def _idle_until(self, now: datetime) -> datetime | None:
        """While no job is live (the next not yet submitted, every one before it done), the time to go
        on from: 48 hours before the next start. The pools' events before it are skipped, as the ledger
        keeps only a pool's newest facts; the first tick after makes each pool what its trace says then.
        None when something is live, or the next start is nearer."""
        pending = [b.submit_at for b in self.books.values() if not b.submitted]
        if not pending or any(t.exited_at is None for t in self.tasks.values()) or self.later:
            return None
        done = {t.job_id for t in self.tasks.values() if t.exit_code == 0}
        if any(b.submitted and b.job_id not in done for b in self.books.values()):
            return None
        go_on = min(pending) - timedelta(hours=WARM_UP_HOURS)
        return go_on if go_on > now + self.gap else None

    def _next_due(self, now: datetime) -> datetime:
        idle = self._idle_until(now)
        if idle is not None:
            self._note(f"no job live: the pools skip to {idle.isoformat()}")
            self.next_reconcile = max(self.next_reconcile, idle)
            return idle
        due = [super()._next_due(now)]
        tick = self._tick(now)
        if any(
            t.available[min(tick + 1, len(t.available) - 1)] != t.available[min(tick, len(t.available) - 1)]
            for t in self.traces
        ):
            due.append(self.at(tick + 1) - WARNING)
        for t in self.tasks.values():
            if not isinstance(t, ReplayTask) or t.exited_at is not None:
                continue
            if t.signalled_at is not None:
                due.append(t.next_step_after(t.signalled_at) or now)
        later = [d for d in due if d > now]
        return min(later) if later else now + timedelta(minutes=5)

    def _all_ended(self) -> bool:
        """Every job's work done and SpotGuard says so, or (asked once an hour) every job ended."""
        if not all(b.submitted for b in self.books.values()):
            return False
        if super()._all_ended():
            return True
        if self.clock.now() < self.next_ended_check:
            return False
        self.next_ended_check = self.clock.now() + ENDED_CHECK
        return all(
            self.world.invoke({"action": "status", "job_id": j})["job"]["finished"] for j in self.books
        )

    # ---------------------------------------------------------------------------------- the result
    def job_runs(self) -> tuple[list[JobRun], list[Work]]:
        """Each job's run (its status now) and work (from its modelled tasks), in the order of the starts."""
        from spotguard_cli.answers import read_answer

        runs, works = [], []
        now = self.clock.now()
        for job_id, tick in self.starts.items():
            status = read_answer(self.world.invoke({"action": "status", "job_id": job_id})).job
            assert status is not None
            deadline = self.at(tick) + timedelta(hours=self.job.deadline_hours)
            runs.append(JobRun(job_id, tick, self.books[job_id].submit_at, deadline, status))
            mine = [t for t in self.tasks.values() if t.job_id == job_id]
            executed = sum(t.step_at(t.exited_at or now, self.total_steps) - t.resumed_step for t in mine)
            needed = self.total_steps if status.state == "succeeded" else None
            works.append(Work(executed, needed, self.books[job_id].steps_lost > 0))
        return runs, works


def _group(name: str, zone: str, spot: bool) -> PoolGroup:
    from spotguard_cli.emulator.gpucluster import PoolGroup

    return PoolGroup(name, f"{name}-group", INSTANCE_TYPE, (zone,), spot)


def run_virtual(
    traces: list[Trace],
    job: Job,
    starts: list[int],
    prices: Prices,
    seed: int,
    work: Path,
    say: Callable[[str], None],
) -> tuple[list[JobRun], list[Work], dict[str, Any]]:
    """Run the jobs starting at the ticks `starts` on the virtual clock; their runs and work (in the order
    of `starts`) and what the run saw (the world's counts, dead letters, calls refused by a role, the run's
    digest, its wall-clock time)."""
    from spotguard_cli.emulator.soak.system import virtual_system
    from spotguard_cli.emulator.vclock import VirtualClock

    work.mkdir(parents=True, exist_ok=True)
    gap = traces[0].gap_hours
    first = max(0, min(starts) - math.ceil(WARM_UP_HOURS / gap))
    last = max(starts) + math.ceil(job.deadline_hours / gap)
    end_tick = min(last, *(len(t.available) for t in traces))  # a job still running then is a miss
    began = time.monotonic()
    clock = VirtualClock(START + timedelta(hours=gap * first))
    with (
        (work / "functions.log").open("w") as log,
        virtual_system(clock, seed, log) as (world, denied, durations),
    ):
        replay = VirtualReplay(world, clock, traces, job, starts, end_tick, prices, say)
        say(f"{len(traces)} spot pool(s) and on-demand on the virtual clock; {len(starts)} job(s)")
        replay.run()
        runs, works = replay.job_runs()
        result = replay.result()
        (work / "timeline.log").write_text("\n".join(result.timeline) + "\n")
        facts: dict[str, Any] = {
            "clock": "virtual",
            "world": dict(replay.counts),
            "dead_letters": {"dead-letter queues": result.dead_letters},
            "denied": sorted({str(d) for g in denied() for d in g.denied}),
            "digest": result.digest,
            "trace_hours_played": round((clock.now() - START).total_seconds() / 3600 - gap * first, 2),
            "pids": [],
            "cold_starts": durations.starts,
            "stopped_early": replay.stopped_early,  # Ctrl-C: the jobs as they stood then
        }
    facts["wall_seconds"] = round(time.monotonic() - began, 1)
    return runs, works, facts
