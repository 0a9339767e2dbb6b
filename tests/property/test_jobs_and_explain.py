"""Properties of the jobs function (manual payloads) and of `spotguard explain`:

- the jobs function always answers `{"ok": ...}`; a refusal is BadRequest, NotFound, Conflict or
  Unreadable with a one-line message, never InternalError (no AWS fault is injected here), and a refused
  payload changes no job: no RunTask, no StopTask, no write to the ledger;
- explain prints one JSON line per file, in order, each act, ignore or reject with a one-line reason,
  and exits 1 exactly when one was rejected; never a traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotguard.domain.jobs.commands import ACTIONS
from spotguard_cli.main import main
from tests.conftest import REPO
from tests.property.harness import PropertyWorld, mutating
from tests.property.strategies import SQS_TEXT, dumps, json_values, mutated

pytestmark = pytest.mark.slow  # hypothesis runs each property over many examples against the stack in moto

JOB_SAMPLES = {p.stem: json.loads(p.read_text()) for p in sorted((REPO / "events" / "jobs").glob("*.json"))}
REFUSALS = {"BadRequest", "NotFound", "Conflict", "Unreadable"}


def _pointed(system: PropertyWorld, name: str) -> dict[str, Any]:
    payload = json.loads(json.dumps(JOB_SAMPLES[name]))
    if name == "status":
        payload["job_id"] = system.job["job_id"]
    if name == "submit":
        payload["request"]["taskDefinition"] = system.jobs.task(system.job["task_arn"])["taskDefinitionArn"]
    return payload


payload_keys = st.sampled_from(
    ["action", "job_id", "task_arn", "request", "options", "state", "limit", "reason"]
)
random_payloads = st.one_of(
    json_values,
    st.dictionaries(payload_keys, json_values, max_size=5),
    st.fixed_dictionaries(
        {"action": st.sampled_from(ACTIONS)}, optional={"job_id": json_values, "x": json_values}
    ),
)


def test_manual_payloads_are_answered_and_a_refusal_changes_nothing(system: PropertyWorld):
    table = system.ledger_table

    @settings(max_examples=120)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        if data.draw(st.booleans()):
            payload: Any = data.draw(random_payloads)
        else:
            payload, _ = data.draw(
                st.sampled_from(sorted(JOB_SAMPLES)).flatmap(lambda n: mutated(_pointed(system, n)))
            )
        system.restore()
        answer, calls = system.invoke_jobs(payload)
        assert isinstance(answer.get("ok"), bool), answer
        if answer["ok"]:
            return
        error = answer["error"]
        assert error["type"] in REFUSALS, (error, payload)
        assert error["message"].strip() and "\n" not in error["message"], error
        changed = [
            op
            for op, params in calls
            if mutating(op) and (op in ("RunTask", "StopTask") or params.get("TableName") == table)
        ]
        assert changed == [], f"refused ({error['message']}) and yet {changed}"

    run()


_DIR = tempfile.mkdtemp(prefix="spotguard-explain-")
ALL_SAMPLES = [
    "spot-interruption-warning",
    "rebalance-recommendation",
    "instance-state-shutting-down",
    "asg-terminate-lifecycle-action",
    "health-scheduled-retirement",
    "ecs-container-instance-state-change",
    "ecs-task-state-change",
    "s3-manifest-created",
    "ebs-snapshot-notification",
]


def test_explain_prints_one_line_per_file_and_never_a_traceback(system: PropertyWorld):
    raw = st.one_of(st.text(SQS_TEXT, max_size=200), json_values.map(dumps), st.binary(max_size=64).map(repr))

    @settings(max_examples=120)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        texts: list[str] = []
        for _ in range(data.draw(st.integers(1, 3))):
            if data.draw(st.booleans()):
                event, _ = data.draw(
                    st.sampled_from(ALL_SAMPLES).flatmap(lambda n: mutated(system.sample(n)))
                )
                texts.append(dumps(event))
            else:
                texts.append(data.draw(raw))
        files = []
        for i, text in enumerate(texts):
            path = os.path.join(_DIR, f"{i}.json")
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(text)
            files.append(path)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["explain", "--clusters", "gpu-spot", *files])
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert [line["file"] for line in lines] == files
        for line in lines:
            assert line["outcome"] in ("act", "ignore", "reject"), line
            assert isinstance(line["reason"], str) and "\n" not in line["reason"], line
        assert code == (1 if any(line["outcome"] == "reject" for line in lines) else 0)

    run()
