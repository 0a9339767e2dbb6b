"""Properties of the three queue functions (interruptions, task events, checkpoints), run in-process with
the stack's environment, fed SQS batches of random input and of mutated real samples:

- nothing escapes: the handler answers with a batch response;
- no record fails: without an AWS fault, a failed record is bad input that SQS would retry five times
  and then dead-letter without a reason;
- a dead-lettered record carries its reason in one line;
- a malformed record (strategies.malformed) is rejected or ignored, and no mutating AWS call follows it;
- the interruption function and `spotguard explain` agree on what is rejected;
- the job every sample points at can still be read afterwards (status and reconcile).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from spotguard_cli.main import main
from tests.property.harness import Outcome, PropertyWorld
from tests.property.strategies import SQS_TEXT, dumps, json_values, malformed, mutated

pytestmark = pytest.mark.slow  # hypothesis runs each property over many examples against the stack in moto

MAX_EVENT_BYTES = 256 * 1024  # EventBridge's largest event (PutEvents entry)
QUEUES = {
    "interruptions": [
        "spot-interruption-warning",
        "spot-interruption-hibernate",
        "rebalance-recommendation",
        "instance-state-shutting-down",
        "instance-state-running",
        "asg-terminate-lifecycle-action",
        "health-scheduled-retirement",
        "health-account-notification",
        "ecs-container-instance-state-change",
        "lifecycle-check",
    ],
    "task-events": [
        "ecs-task-state-change",
        "ebs-snapshot-notification",
        "asg-launch-unsuccessful",
        "asg-launch-successful",
        "launch-due",
    ],
    "checkpoints": ["s3-manifest-created"],
}
EXAMPLES = {"interruptions": 120, "task-events": 100, "checkpoints": 60}
_EXPLAIN_DIR = tempfile.mkdtemp(prefix="spotguard-property-")


def check_record(name: str | None, event: object, done: list[str], out: Outcome) -> None:
    what = f"{name}: {done}" if name else f"random body {out.body[:200]!r}"
    assert not out.failed, (
        f"a record failed (SQS would retry it, then dead-letter it without a reason): {what}"
    )
    if out.dead is not None:
        assert out.dead.strip() and "\n" not in out.dead and len(out.dead) <= 1000, (out.dead, what)
    why = malformed(name, event) if name else "not an event"
    if why is not None:
        assert out.effects == [], f"malformed ({why}) and yet acted on with {out.effects}: {what}"


def explain(body: str) -> dict:
    path = os.path.join(_EXPLAIN_DIR, "event.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(body)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["explain", "--clusters", "gpu-spot", path])
    (line,) = out.getvalue().splitlines()
    answer = json.loads(line)
    assert code == (1 if answer["outcome"] == "reject" else 0)
    return answer


def batches(system: PropertyWorld, queue: str) -> st.SearchStrategy:
    one = st.sampled_from(QUEUES[queue]).flatmap(
        lambda n: mutated(system.sample(n)).map(lambda m, n=n: (n, m[0], m[1]))
    )
    return st.lists(one, min_size=1, max_size=3)


def run_batch(system: PropertyWorld, queue: str, batch: list) -> None:
    bodies = [dumps(event) for _, event, _ in batch]
    # EventBridge puts no event over 256 KB on a queue (a 1.5 MB one could not even be dead-lettered)
    assume(all(len(b.encode()) <= MAX_EVENT_BYTES for b in bodies))
    system.restore()
    outcomes = system.deliver(queue, bodies)
    for (name, event, done), out in zip(batch, outcomes, strict=True):
        check_record(name, event, done, out)
        if queue == "interruptions" and not (isinstance(event, dict) and event.get("source") == "aws.s3"):
            said = explain(out.body)
            assert (said["outcome"] == "reject") == (out.dead is not None), (said, out.dead, done)


@pytest.mark.parametrize("queue", list(QUEUES))
def test_mutated_samples_are_acted_on_ignored_or_rejected_never_retried(system: PropertyWorld, queue: str):
    @settings(max_examples=EXAMPLES[queue])
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        run_batch(system, queue, data.draw(batches(system, queue)))

    run()
    # the job the samples point at still reads: nothing an example did poisoned it
    answer = system.jobs.invoke({"action": "status", "job_id": system.job["job_id"]})
    assert answer["ok"], answer
    counts = system.jobs.reconcile()
    assert counts["unreadable"] == 0 and counts["failed"] == 0, counts


bodies = st.one_of(
    st.text(SQS_TEXT, max_size=200),
    json_values.map(dumps),
    st.dictionaries(
        st.sampled_from(["id", "source", "detail-type", "time", "detail", "version", "account", "region"]),
        json_values,
    ).map(dumps),
)


@pytest.mark.parametrize("queue", list(QUEUES))
def test_random_bodies_are_rejected_or_ignored_and_never_acted_on(system: PropertyWorld, queue: str):
    @settings(max_examples=25)
    @given(batch=st.lists(bodies, min_size=1, max_size=4))
    def run(batch: list[str]) -> None:
        for out in system.deliver(queue, batch):
            check_record(None, None, [], out)

    run()
