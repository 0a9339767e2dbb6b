"""`SoakFaults`: the faults a soak plays, each with the chance `--faults` gives it where it can happen: in
the world (task events delivered twice, held back or lost, instances taken back without a warning, a last
commit cut by the reclaim, a job cancelled by its user), and at SpotGuard's own AWS calls (the injector of
emulator/faults.py)."""

from __future__ import annotations

import contextlib
import heapq
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from spotguard_cli.emulator.soak.model import WARNING_SECONDS
from spotguard_cli.emulator.soak.state import SoakState

if TYPE_CHECKING:
    from spotguard_cli.emulator.faults import Injector
    from spotguard_cli.emulator.gpucluster import Host
    from spotguard_cli.emulator.soak.model import SoakPlan, Task

# The faults `--faults RATE` draws, each at every place it can happen: a task event delivered twice, or
# held back (a later one overtakes it), a spot instance taken back with no warning, a stopped task's last
# commit cut by the reclaim; and at SpotGuard's AWS calls (emulator/faults.py), throttling and 5xx (once,
# or every attempt), a lost answer (seen, or retried by botocore), a conditional write raced, and the
# invocation cut.
WORLD_FAULTS = ("duplicated", "reordered", "no-warning", "commit-cut", "lost-running", "cancelled")
CALL_FAULTS = (
    "throttle-once",
    "throttle-exhaust",
    "5xx-once",
    "5xx-exhaust",
    "lost",
    "lost-retried",
    "race",
    "cut",
)
FAULTS = WORLD_FAULTS + CALL_FAULTS


class SoakFaults(SoakState):
    """The faults: drawn (`_fault`), played in the world, and installed at SpotGuard's calls."""

    # -------------------------------------------------------------------------------- in the world
    def _fault(self, kind: str) -> bool:
        hit = self.faults > 0 and self.chance.random() < self.faults
        if hit:
            self.faults_done[kind] += 1
        return hit

    def _emit(self, arn: str, exit_code: int | None) -> None:
        """ECS's task event, through EventBridge: at once, or (a fault) held back so that a later one
        overtakes it, and (another) delivered twice."""
        event = self.world.event(arn, exit_code=exit_code)
        now = self.clock.now()
        what = f"{arn[-8:]}'s {event['detail']['lastStatus']} event (version {event['detail']['version']})"
        if event["detail"]["lastStatus"] == "RUNNING" and self._fault("lost-running"):
            self._note(f"fault: {what} lost")  # for good: only ECS's word (DescribeTasks) says it runs
            return
        if self._fault("reordered"):
            when = now + timedelta(seconds=self.chance.uniform(1, 60))
            self._hold(when, event)
            self._note(f"fault: {what} held back to {when.isoformat()}")
        else:
            self.world.put(event)
        if self._fault("duplicated"):
            when = now + timedelta(seconds=self.chance.uniform(1, 120))
            self._hold(when, event)
            self._note(f"fault: {what} delivered again at {when.isoformat()}")

    def _hold(self, when: datetime, event: dict[str, Any]) -> None:
        heapq.heappush(self.later, (when, next(self.held), event))

    def _deliver_held(self, now: datetime) -> None:
        while self.later and self.later[0][0] <= now:
            self.world.put(heapq.heappop(self.later)[2])

    def _slow_last_commits(self, host: Host) -> None:
        """A fault: a task the warning stopped takes longer than the warning to write its last checkpoint
        (a big one, a slow store), so the reclaim cuts it."""
        for task in self._live_on(host):
            if task.stop_asked_at is not None and task.running_at is not None and self._fault("commit-cut"):
                task.stop_seconds = WARNING_SECONDS + self.chance.uniform(10, 300)
                self._note(
                    f"fault: {task.arn[-8:]} ({task.job_id}/{task.attempt})'s last commit takes "
                    f"{task.stop_seconds:.0f} s, longer than the warning"
                )

    def _commit_cut(self, task: Task) -> None:
        """The instance goes while the task writes a checkpoint: the next sequence's data files reach the
        bucket, its MANIFEST.json never does (nor its event). The committed checkpoint stays the one
        before, which the next attempt must resume from (the steps it would lose are counted if not)."""
        book = self.books[task.job_id]
        bucket, prefix = book.checkpoint_uri.removeprefix("s3://").split("/", 1)
        key = f"{prefix}checkpoints/{book.sequence + 1:08d}/model.pt"
        self.world.stack.client("s3").put_object(Bucket=bucket, Key=key, Body=b"half-written")
        self._note(
            f"{task.arn[-8:]} ({task.job_id}/{task.attempt}) cut mid-commit: s3://{bucket}/{key} "
            "written, no manifest"
        )

    # ------------------------------------------------------------------------ at SpotGuard's calls
    def _injector(self, plan: SoakPlan, seed: int) -> Injector | None:
        """Faults at SpotGuard's own AWS calls, only while one of its functions runs (emulator/faults.py):
        installed after the soak's own hooks, so that a lost answer to StopTask is still seen by the
        model (ECS did stop the task)."""
        import random

        from spotguard_cli.emulator.faults import Injector
        from spotguard_cli.emulator.iam import RUNNING

        rate = plan.faults if plan.call_faults is None else plan.call_faults
        if rate <= 0:
            return None
        stack = self.world.stack
        env = stack.functions["JobsFunction"].environment
        tables = {env["SPOTGUARD_LEDGER_TABLE"]: "ledger", env["SPOTGUARD_IDEMPOTENCY_TABLE"]: "idempotency"}
        injector = Injector(stack.client, tables, record=False)
        injector.install()
        injector.seeded(
            rate, random.Random(seed * 7919 + 2), say=self._hear, in_scope=lambda: RUNNING.get() is not None
        )
        return injector

    def _faults_in_place(self) -> contextlib.AbstractContextManager[None]:
        """With faults at SpotGuard's calls: moto skips a request the injector answered with an error, and
        botocore's backoff between retries takes its time on the virtual clock, not the wall clock. The
        functions run without their threads in every soak (`virtual_system`), so a cut ends the invocation
        where it happens, the records after it never handled, as in Lambda."""
        if self.injector is None:
            return contextlib.nullcontext()
        from spotguard_cli.emulator.clockpatch import no_backoff
        from spotguard_cli.emulator.faults import moto_skips_answered_requests

        stack = contextlib.ExitStack()
        stack.enter_context(moto_skips_answered_requests())
        stack.enter_context(no_backoff(sleep=self.clock.advance))
        return stack

    def _own(self) -> contextlib.AbstractContextManager[None]:
        """The soak's own look at the system through SpotGuard's code (a job's status): never faulted."""
        return contextlib.nullcontext() if self.injector is None else self.injector.paused()
