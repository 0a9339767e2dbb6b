"""The early replacement's steps, pure (domain.jobs.spares): a spare asked once per attempt, the relaunch
carrying out the warning's decision, and the spare given back when the job no longer needs it."""

from __future__ import annotations

from datetime import timedelta

from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.capacity.model import Market
from spotguard.domain.jobs.effects import GiveBackSpare, RaiseSpare
from spotguard.domain.jobs.launches import begin_launch, launch_succeeded
from spotguard.domain.jobs.model import JobState
from spotguard.domain.jobs.spares import (
    GIVE_BACK_LIMIT_SECONDS,
    RETRY_GIVE_BACK_SECONDS,
    SPARE_BOUND_SECONDS,
    ask_spare,
    give_back,
    spare_given_back,
    spare_raised,
    spare_unneeded,
)
from spotguard.domain.jobs.transitions import on_task_event, request_cancel

from .test_jobs_domain import T0, TASK, _ev, _running

POOL_B = "gpu-spot-b/g5.xlarge/us-east-1b"
B = PlacementDecision(
    at=T0,
    placement=Market.SPOT,
    pool=POOL_B,
    capacity_provider="gpu-spot-b",
    instance_type="g5.xlarge",
    availability_zone="us-east-1b",
    reason="spot in the cheapest pool",
)


def _on_host(job, instance="i-0aaaa"):
    live = job.live_attempt
    return job.model_copy(
        update={"attempts": [*job.attempts[:-1], live.model_copy(update={"instance_id": instance})]}
    )


def _asked():
    job = _on_host(_running())
    step = ask_spare(job, "ev-1", "i-0aaaa", B, "gpu-spot-b-group", T0)
    assert step.effects == [RaiseSpare(attempt=1, group="gpu-spot-b-group")]
    return step.job


def test_a_warning_asks_one_spare_per_attempt_and_only_for_the_warned_host():
    job = _asked()
    assert job.spare.state == "asked" and job.spare.decision.trigger == "warning"
    again = ask_spare(job, "ev-1", "i-0aaaa", B, "gpu-spot-b-group", T0)  # the same notice again
    assert again.job is None and again.effects == [] and "already" in again.note
    later = T0 + timedelta(minutes=5)
    second = ask_spare(job, "ev-2", "i-0aaaa", B, "gpu-spot-b-group", later)  # another notice for the host
    assert second.effects == [] and "already" in second.note
    assert second.job.spare.notice == "ev-2" and second.job.spare.asked_at == later  # its bound from here
    other = ask_spare(_on_host(_running()), "ev-1", "i-0bbbb", B, "gpu-spot-b-group", T0)
    assert other.job is None and other.effects == []


def test_no_spare_for_a_wait_or_a_group_not_listed():
    job = _on_host(_running())
    wait = B.model_copy(update={"placement": Market.NONE, "pool": None, "reason": "spot back soon"})
    assert ask_spare(job, "e", "i-0aaaa", wait, "gpu-spot-b-group", T0).effects == []
    unlisted = ask_spare(job, "e", "i-0aaaa", B, None, T0)
    assert unlisted.effects == [] and "may not scale" in unlisted.note


def test_the_relaunch_after_the_stop_carries_out_the_warning_s_decision():
    job = spare_raised(_asked(), 1, True, ("i-old",), "raised", T0).job
    stopped = on_task_event(job, _ev(job.attempts[0].task_arn, 3, "STOPPED", 75), None, T0).job
    assert stopped.state is JobState.QUEUED
    assert stopped.placement is not None and stopped.placement.pool == POOL_B
    assert stopped.placement.trigger == "warning"
    # a spare that was not raised (group at its maximum) carries nothing: the launch decides again
    not_raised = spare_raised(_asked(), 1, False, (), "at its maximum size", T0).job
    stopped = on_task_event(not_raised, _ev(not_raised.attempts[0].task_arn, 3, "STOPPED", 75), None, T0).job
    assert stopped.placement is None


def _relaunched(job, pool: str):
    job = on_task_event(job, _ev(job.attempts[0].task_arn, 3, "STOPPED", 75), None, T0).job
    job = begin_launch(job, T0, B.model_copy(update={"pool": pool})).job
    job = launch_succeeded(job, f"{TASK}{2:032x}", "tok", "", T0, resubmitted=True).job
    return job.model_copy(
        update={"attempts": [*job.attempts[:-1], job.attempts[-1].model_copy(update={"pool": pool})]}
    )


def test_the_spare_is_unneeded_once_the_next_attempt_runs_or_went_elsewhere():
    job = spare_raised(_asked(), 1, True, (), "raised", T0).job
    assert spare_unneeded(job, T0) is None
    provisioning = _relaunched(job, POOL_B)
    assert spare_unneeded(provisioning, T0) is None  # still waiting for the spare to boot
    running = on_task_event(provisioning, _ev(provisioning.attempts[-1].task_arn, 2, "RUNNING"), None, T0).job
    assert spare_unneeded(running, T0) == "attempt 2 runs"
    elsewhere = _relaunched(job, "gpu-od/g5.xlarge/us-east-1a")
    assert spare_unneeded(elsewhere, T0) == "attempt 2 was placed in gpu-od/g5.xlarge/us-east-1a"


def test_the_spare_is_unneeded_when_the_job_is_cancelled_or_after_its_bound():
    job = spare_raised(_asked(), 1, True, (), "raised", T0).job
    cancelled = request_cancel(job, T0, "user").job
    assert "cancel" in spare_unneeded(cancelled, T0)
    late = T0 + timedelta(seconds=SPARE_BOUND_SECONDS)
    assert spare_unneeded(job, late - timedelta(seconds=1)) is None
    assert "within 20 minutes" in spare_unneeded(job, late)


def test_give_back_once_and_again_only_if_the_first_try_did_not_finish():
    job = spare_raised(_asked(), 1, True, ("i-old",), "raised", T0).job
    step = give_back(job, "the job succeeded", T0)
    assert step.effects == [
        GiveBackSpare(attempt=1, cluster=job.request.cluster, group="gpu-spot-b-group", before=("i-old",))
    ]
    giving = step.job
    assert giving.spare.state == "giving-back" and not giving.spare.holds
    assert spare_unneeded(giving, T0 + timedelta(seconds=RETRY_GIVE_BACK_SECONDS - 1)) is None
    # the call's record failed and came back later: the give-back is tried again
    assert spare_unneeded(giving, T0 + timedelta(seconds=RETRY_GIVE_BACK_SECONDS)) == "the job succeeded"
    done = spare_given_back(giving, 1, "terminated i-new", "i-new", T0).job
    assert done.spare.state == "given-back" and spare_unneeded(done, T0 + timedelta(hours=1)) is None
    kept = spare_given_back(giving, 1, "1 new instance(s) run tasks", None, T0).job
    assert kept.spare.state == "kept"


def test_a_spare_asked_at_a_rebalance_is_the_warning_s_and_one_given_back_may_be_asked_again():
    job = spare_raised(_asked(), 1, True, (), "raised", T0).job  # asked at notice ev-1 (a rebalance)
    held = ask_spare(job, "ev-warning", "i-0aaaa", B, "gpu-spot-b-group", T0)
    assert held.effects == [] and held.job.spare.notice == "ev-warning"  # found held: nothing more asked
    later = T0 + timedelta(seconds=SPARE_BOUND_SECONDS)
    ended = spare_given_back(
        give_back(job, "no attempt took it", later).job, 1, "terminated", "i-new", later
    ).job
    assert ask_spare(ended, "ev-1", "i-0aaaa", B, "gpu-spot-b-group", later).effects == []  # ev-1 again
    again = ask_spare(ended, "ev-warning", "i-0aaaa", B, "gpu-spot-b-group", later)
    assert again.effects == [RaiseSpare(attempt=1, group="gpu-spot-b-group")]


def test_the_bound_does_not_take_a_spare_the_next_attempt_waits_for():
    job = spare_raised(_asked(), 1, True, (), "raised", T0).job
    waiting = _relaunched(job, POOL_B)  # PROVISIONING in the spare's pool, its instance still booting
    assert spare_unneeded(waiting, T0 + timedelta(seconds=SPARE_BOUND_SECONDS * 2)) is None


def test_a_spare_not_given_back_yet_blocks_the_next_one():
    """One at a time: a spare of attempt 1 still being given back (its call failed) is not forgotten by
    a warning on attempt 2's host."""
    job = spare_raised(_asked(), 1, True, (), "raised", T0).job
    giving = give_back(job, "the job moved on", T0).job
    second = _relaunched(giving, POOL_B)
    second = on_task_event(second, _ev(second.attempts[-1].task_arn, 2, "RUNNING"), None, T0).job
    on_host = second.model_copy(
        update={
            "attempts": [
                *second.attempts[:-1],
                second.attempts[-1].model_copy(update={"instance_id": "i-0bbbb"}),
            ]
        }
    )
    blocked = ask_spare(on_host, "ev-9", "i-0bbbb", B, "gpu-spot-b-group", T0)
    assert blocked.effects == [] and "not given back yet (giving-back)" in blocked.note


def test_a_spare_still_being_asked_is_not_given_back_until_its_answer_or_its_ask_is_stale():
    asked = _asked()  # the group not answered yet: `before` unknown
    cancelled = request_cancel(asked, T0, "user").job
    assert spare_unneeded(cancelled, T0) is None  # wait for the answer, which gives `before`
    stale = T0 + timedelta(seconds=RETRY_GIVE_BACK_SECONDS)
    assert spare_unneeded(cancelled, stale) == "its ask did not finish"
    ended = give_back(cancelled, "its ask did not finish", stale)
    assert ended.effects == [] and ended.job.spare.state == "not-raised"  # nothing terminated blindly


def test_a_give_back_with_nothing_to_terminate_yet_is_tried_again_until_its_limit():
    job = spare_raised(_asked(), 1, True, ("i-old",), "raised", T0).job
    giving = give_back(job, "the job succeeded", T0).job
    pending = spare_given_back(giving, 1, "no instance listed yet", None, T0, final=False).job
    assert pending.spare.state == "giving-back"
    assert spare_unneeded(pending, T0 + timedelta(seconds=RETRY_GIVE_BACK_SECONDS)) == "the job succeeded"
    late = T0 + timedelta(seconds=GIVE_BACK_LIMIT_SECONDS)
    done = spare_given_back(pending, 1, "no instance listed yet", None, late, final=False).job
    assert done.spare.state == "kept" and "given up after 40 minutes" in done.spare.detail
