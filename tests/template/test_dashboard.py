"""template.yaml's CloudWatch dashboard: its body renders to JSON, every widget reads a metric the code
emits (namespace, name and exactly its dimensions) or one of the few AWS metrics it uses, it covers
every queue and function of the stack, the Dashboard parameter turns it off, and its URL is an output.

What the code emits is read from the source (an AST walk over every `add_metric` and `single_metric`),
and checked once more by running the jobs path's meters and reading the EMF they print.
"""

from __future__ import annotations

import ast
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from spotguard.adapters.job_metrics import (
    LIVE_STATES,
    PLACEMENTS,
    MeteredNotifications,
    SpendMeter,
    count_jobs_by_state,
)
from spotguard.adapters.notify import DETAIL_TYPES
from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.jobs.model import Attempt, Job, JobState
from spotguard.domain.jobs.replies import Notification
from spotguard.domain.jobs.submission import RunTaskRequest
from spotguard_cli.emulator.template import REPO, load, translate
from tests.fakes import FakeNotifier

PARAMS = {"ClusterNames": "gpu-spot,train-a100"}
REGION = "eu-west-1"
SOURCES = [REPO / "functions", REPO / "layers" / "core" / "spotguard"]

# The AWS metrics the dashboard may read, and the one dimension each is read by.
AWS_METRICS = {
    ("AWS/SQS", "ApproximateAgeOfOldestMessage"): "QueueName",
    ("AWS/SQS", "ApproximateNumberOfMessagesVisible"): "QueueName",
    ("AWS/Lambda", "Errors"): "FunctionName",
    ("AWS/Lambda", "Throttles"): "FunctionName",
    ("AWS/Lambda", "Duration"): "FunctionName",
}
# The values a dimensioned metric of SpotGuard's can take, from the code that sets them.
DIMENSION_VALUES = {
    ("JobEvents", "kind"): set(DETAIL_TYPES),
    ("CapacityDecisions", "placement"): set(PLACEMENTS.values()),
    ("JobsByState", "state"): {str(s) for s in LIVE_STATES},
}


@pytest.fixture(scope="module")
def sam() -> dict[str, Any]:
    return load()


@pytest.fixture(scope="module")
def cfn() -> dict[str, Any]:
    return translate(parameters=PARAMS, region=REGION)


@pytest.fixture(scope="module")
def powertools(sam) -> tuple[str, str]:
    """The namespace and service every function's Metrics get (template Globals), set nowhere else."""
    env = sam["Globals"]["Function"]["Environment"]["Variables"]
    for name, res in sam["Resources"].items():
        own = res.get("Properties", {}).get("Environment", {}).get("Variables", {})
        assert not {k for k in own if k.startswith("POWERTOOLS_METRICS") or k == "POWERTOOLS_SERVICE_NAME"}, (
            name
        )
    return env["POWERTOOLS_METRICS_NAMESPACE"], env["POWERTOOLS_SERVICE_NAME"]


# ------------------------------------------------------------------------ what the code emits
def _const(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _names(call: ast.Call, path: Path) -> list[str]:
    name = _kw(call, "name")
    if _const(name):
        return [_const(name)]  # type: ignore[list-item]
    # The one name from a table: functions/reconcile/app.py emits the sweep's counts by the metric names
    # SweepCounts gives them (`for name, value in counts.metrics()`)
    assert path == REPO / "functions" / "reconcile" / "app.py", f"{path}: a metric name the test cannot read"
    assert isinstance(name, ast.Name) and name.id == "name", ast.unparse(name)
    from spotguard.usecases.jobs.sweep import SweepCounts

    return SweepCounts.metric_names()


def emitted_metrics() -> dict[str, set[frozenset[str]]]:
    """Metric name -> the dimension sets it is emitted with (besides `service`, which every one has)."""
    out: dict[str, set[frozenset[str]]] = {}
    for root in SOURCES:
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            in_single: set[int] = set()
            for node in ast.walk(tree):
                if not isinstance(node, ast.With):
                    continue
                for item in node.items:
                    call = item.context_expr
                    if not (isinstance(call, ast.Call) and _call_name(call) == "single_metric"):
                        continue
                    var = item.optional_vars.id if isinstance(item.optional_vars, ast.Name) else None
                    dims = set()
                    for inner in ast.walk(node):
                        if isinstance(inner, ast.Call) and _call_name(inner) == "add_dimension":
                            assert isinstance(inner.func, ast.Attribute)
                            assert getattr(inner.func.value, "id", None) == var, f"{path}:{inner.lineno}"
                            dim = _const(_kw(inner, "name"))
                            assert dim, f"{path}:{inner.lineno}: a dimension name the test cannot read"
                            dims.add(dim)
                            in_single.add(id(inner))
                    assert "default_dimensions" not in {k.arg for k in call.keywords}, path
                    for name in _names(call, path):
                        out.setdefault(name, set()).add(frozenset(dims))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                what = _call_name(node)
                # a dimension on the shared Metrics would change every metric's: none is added so
                assert what not in ("set_default_dimensions", "add_dimensions"), f"{path}:{node.lineno}"
                assert what != "add_dimension" or id(node) in in_single, f"{path}:{node.lineno}"
                if what == "add_metric":
                    for name in _names(node, path):
                        out.setdefault(name, set()).add(frozenset())
    return out


@pytest.fixture(scope="module")
def emitted() -> dict[str, set[frozenset[str]]]:
    return emitted_metrics()


def test_the_walk_finds_the_metrics_of_every_function(emitted):
    for name in (
        "Notices",
        "SecondsToSignal",
        "HostsDrained",
        "TasksSignalled",
        "CheckpointsCommitted",
        "JobsSubmitted",
        "TaskEvents",
        "ReconcileFailed",
        "JobEvents",
        "CapacityDecisions",
        "JobsByState",
        "GpuHours",
        "DollarsLost",
    ):
        assert name in emitted, name
    assert emitted["Notices"] == {frozenset({"kind", "outcome"})}
    assert emitted["JobEvents"] == {frozenset({"kind"})}
    assert emitted["SecondsToSignal"] == {frozenset()}


# -------------------------------------------------------------------------------- the body
def _fake(name: str) -> str:
    """What a ${...} of the body stands for, with fake values: the region, or a resource's name."""
    if name == "AWS::Region":
        return REGION
    return f"spotguard-{name.split('.')[0]}-0A1B2C"


@pytest.fixture(scope="module")
def dashboard(cfn) -> dict[str, Any]:
    return cfn["Resources"]["OperationsDashboard"]


@pytest.fixture(scope="module")
def body(dashboard, cfn) -> dict[str, Any]:
    sub = dashboard["Properties"]["DashboardBody"]["Fn::Sub"]
    assert isinstance(sub, str), "one string: the body names its resources as ${Name} / ${Name.Attr}"
    for name in set(re.findall(r"\$\{([^}!]+)\}", sub)):
        if name.startswith("AWS::"):
            assert name == "AWS::Region"
            continue
        logical, _, attr = name.partition(".")
        res = cfn["Resources"][logical]  # KeyError: the body names a resource the stack does not have
        if attr:
            assert (res["Type"], attr) == ("AWS::SQS::Queue", "QueueName"), name
        else:
            assert res["Type"] == "AWS::Lambda::Function", name  # Ref: the function's name
    return json.loads(re.sub(r"\$\{([^}!]+)\}", lambda m: _fake(m.group(1)), sub))


def _metrics(body: dict[str, Any]) -> list[tuple[str, str, dict[str, str], dict[str, Any]]]:
    """(namespace, name, dimensions, options) of every metric line of every widget (no shorthand)."""
    out = []
    for w in body["widgets"]:
        if w["type"] != "metric":
            continue
        for line in w["properties"]["metrics"]:
            if isinstance(line[-1], dict) and "expression" in line[-1]:
                continue  # a SEARCH: see _searches
            options = line[-1] if isinstance(line[-1], dict) else {}
            head = line[:-1] if options else line
            assert all(isinstance(x, str) and x not in (".", "..") for x in head), line
            namespace, name, *pairs = head
            assert len(pairs) % 2 == 0, line
            out.append((namespace, name, dict(zip(pairs[::2], pairs[1::2], strict=True)), options))
    return out


def _searches(body: dict[str, Any]) -> list[tuple[str, set[str], str, dict[str, str]]]:
    """(namespace, dimension names, metric name, dimension values) of every SEARCH expression."""
    out = []
    for w in body["widgets"]:
        for line in w["properties"].get("metrics", []):
            if not (isinstance(line[-1], dict) and "expression" in line[-1]):
                continue
            expr = line[-1]["expression"]
            m = re.fullmatch(r"SEARCH\('\{([^}]*)\}((?: \w+=\"[^\"]*\")+)', '\w+', \d+\)", expr)
            assert m, expr
            namespace, *dims = m.group(1).split(",")
            terms = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out.append((namespace, set(dims), terms.pop("MetricName"), terms))
    return out


def test_the_body_is_json_with_the_stack_region_on_every_widget(body):
    assert len(body["widgets"]) >= 12
    for w in body["widgets"]:
        assert w["type"] in ("metric", "text")
        assert 1 <= w["width"] <= 24 and w["height"] >= 1
        if w["type"] == "metric":
            assert w["properties"]["region"] == REGION
            assert w["properties"]["title"]


def test_every_spotguard_metric_is_one_the_code_emits_with_exactly_its_dimensions(body, emitted, powertools):
    namespace, service = powertools
    seen = 0
    for ns, name, dims, _ in _metrics(body):
        if ns.startswith("AWS/"):
            continue
        seen += 1
        assert ns == namespace, name
        assert dims.pop("service", None) == service, f"{name}: every EMF metric has service={service}"
        assert name in emitted, f"{name}: no add_metric or single_metric emits it"
        assert frozenset(dims) in emitted[name], f"{name} {sorted(dims)}: emitted with {emitted[name]}"
        for dim, value in dims.items():
            assert value in DIMENSION_VALUES[(name, dim)], f"{name} {dim}={value}: never emitted"
    for ns, dims, name, values in _searches(body):
        assert ns == namespace and values == {"service": service}
        assert frozenset(dims - {"service"}) in emitted[name] and "service" in dims, (name, dims)
        seen += 1
    assert seen >= 20


def test_aws_metrics_are_the_few_used_and_name_the_stacks_own_queues_and_functions(body, cfn):
    names = {
        "QueueName": {_fake(k) for k, r in cfn["Resources"].items() if r["Type"] == "AWS::SQS::Queue"},
        "FunctionName": {
            _fake(k) for k, r in cfn["Resources"].items() if r["Type"] == "AWS::Lambda::Function"
        },
    }
    for ns, name, dims, _ in _metrics(body):
        if not ns.startswith("AWS/"):
            continue
        assert (ns, name) in AWS_METRICS, (ns, name)
        (dim,) = dims
        assert dim == AWS_METRICS[(ns, name)]
        assert dims[dim] in names[dim], dims


def _read(body, namespace: str, name: str, **dims: str) -> list[dict[str, Any]]:
    """The options of every line of the body that reads this metric with (at least) these dimensions."""
    return [o for ns, n, d, o in _metrics(body) if (ns, n) == (namespace, name) and dims.items() <= d.items()]


def test_the_widgets_asked_for_are_there(body, cfn):
    searched = {name for _, _, name, _ in _searches(body)}
    assert "Notices" in searched  # by kind and outcome
    assert {o.get("stat") for o in _read(body, "SpotGuard", "SecondsToSignal")} == {"p50", "p99"}
    for name in ("HostsDrained", "GpuHours", "GpuHoursLost", "DollarsSpent", "DollarsLost"):
        assert _read(body, "SpotGuard", name), name
    for state in LIVE_STATES:
        assert _read(body, "SpotGuard", "JobsByState", state=str(state)), state
    for kind in ("resubmitted", "waiting", "interrupted", "succeeded", "failed"):
        assert _read(body, "SpotGuard", "JobEvents", kind=kind), kind
    for placement in ("spot", "on-demand", "wait"):
        assert _read(body, "SpotGuard", "CapacityDecisions", placement=placement), placement

    queues = [k for k, r in cfn["Resources"].items() if r["Type"] == "AWS::SQS::Queue"]
    dead = [k for k in queues if "DeadLetter" in k]
    redrives = {
        r["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
        for r in cfn["Resources"].values()
        if r["Type"] == "AWS::SQS::Queue" and "RedrivePolicy" in r["Properties"]
    }
    assert redrives <= set(dead) and len(dead) >= 4
    for q in queues:
        assert _read(body, "AWS/SQS", "ApproximateAgeOfOldestMessage", QueueName=_fake(q)), q
    for q in dead:
        assert _read(body, "AWS/SQS", "ApproximateNumberOfMessagesVisible", QueueName=_fake(q)), q
    functions = [k for k, r in cfn["Resources"].items() if r["Type"] == "AWS::Lambda::Function"]
    assert len(functions) == 5
    for f in functions:
        for name in ("Errors", "Throttles", "Duration"):
            assert _read(body, "AWS/Lambda", name, FunctionName=_fake(f)), (f, name)


# ------------------------------------------------------------- the parameter and the output
def _holds(condition: Any, params: dict[str, str], sam: dict[str, Any]) -> bool:
    """The few intrinsics the dashboard's condition may use, evaluated."""
    if "Fn::Equals" in condition:
        a, b = (_value(x, params, sam) for x in condition["Fn::Equals"])
        return a == b
    if "Condition" in condition:
        return _holds(sam["Conditions"][condition["Condition"]], params, sam)
    raise AssertionError(f"an intrinsic this test does not evaluate: {condition}")


def _value(x: Any, params: dict[str, str], sam: dict[str, Any]) -> Any:
    if isinstance(x, dict) and "Ref" in x:
        return params.get(x["Ref"], sam["Parameters"][x["Ref"]].get("Default"))
    return x


@pytest.mark.parametrize(("value", "on"), [(None, True), ("true", True), ("false", False)])
def test_the_dashboard_parameter_turns_it_and_its_output_on_and_off(sam, value, on):
    param = sam["Parameters"]["Dashboard"]
    assert param["AllowedValues"] == ["true", "false"] and param["Default"] == "true"
    params = {} if value is None else {"Dashboard": value}
    cfn = translate(parameters={**PARAMS, **params})
    resource, output = cfn["Resources"]["OperationsDashboard"], cfn["Outputs"]["DashboardUrl"]
    assert resource["Type"] == "AWS::CloudWatch::Dashboard"
    assert resource["Condition"] == output["Condition"] == "DashboardOn"
    assert _holds(cfn["Conditions"]["DashboardOn"], params, sam) is on


def test_the_url_of_the_dashboard_is_an_output(cfn, dashboard):
    value = cfn["Outputs"]["DashboardUrl"]["Value"]["Fn::Sub"]
    assert "${OperationsDashboard}" in value and "region=${AWS::Region}" in value
    url = value.replace("${OperationsDashboard}", "stack-eu-west-1").replace("${AWS::Region}", REGION)
    assert url.startswith("https://") and url.endswith("#dashboards/dashboard/stack-eu-west-1")
    # a dashboard's name is account-wide: the same stack name in two regions must not collide
    assert dashboard["Properties"]["DashboardName"] == {"Fn::Sub": "${AWS::StackName}-${AWS::Region}"}


# ---------------------------------------------- the jobs path's meters, as CloudWatch reads them
def _emf(out: str) -> set[tuple[str, str, frozenset[str]]]:
    seen = set()
    for line in out.splitlines():
        if not line.startswith('{"_aws"'):
            continue
        blob = json.loads(line)
        for group in blob["_aws"]["CloudWatchMetrics"]:
            (dims,) = group["Dimensions"]
            for m in group["Metrics"]:
                seen.add((group["Namespace"], m["Name"], frozenset(dims)))
    return seen


T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class _Store:
    def __init__(self, refs: list[CheckpointRef]) -> None:
        self.refs, self.reads = refs, 0

    def checkpoints(self, prefix_uri: str) -> list[CheckpointRef]:
        self.reads += 1
        return self.refs


def _attempt(n: int, **kw: Any) -> Attempt:
    return Attempt(
        number=n, task_arn=f"arn:aws:ecs:us-east-1:123456789012:task/gpu-spot/t{n}", launched_at=T0, **kw
    )


def test_the_jobs_meters_emit_what_the_walk_found(capsys, emitted, powertools):
    namespace, _ = powertools
    inner = FakeNotifier()
    decision = Notification(
        id="j:1:0", kind="decision", job_id="j", message="wait", detail={"placement": "none"}
    )
    MeteredNotifications(inner).send_all([decision])
    assert inner.sent == [decision]
    count_jobs_by_state(dict.fromkeys(LIVE_STATES, 2))

    job = Job(
        job_id="j1",
        state=JobState.QUEUED,
        request=RunTaskRequest(cluster="gpu-spot", taskDefinition="train-4gpu:1", launchType="EC2"),
        checkpoint_uri="s3://bucket/jobs/j1/",
        gpus=4,
        containers=["train"],
        created_at=T0,
        updated_at=T0,
    )
    running = job.model_copy(update={"attempts": [_attempt(1, started_at=T0, last_status="RUNNING")]})
    stopped = _attempt(
        1,
        started_at=T0,
        stopped_at=T0 + timedelta(hours=2),
        last_status="STOPPED",
        outcome="resubmit",
        price_per_hour=3.0,
    )
    after = job.model_copy(update={"attempts": [stopped]})
    ref = CheckpointRef(
        prefix_uri=job.checkpoint_uri,
        sequence=1,
        manifest_uri="m",
        attempt=1,
        created_at=T0 + timedelta(hours=1.5),
    )
    store = _Store([ref])
    meter = SpendMeter(store)  # type: ignore[arg-type]
    capsys.readouterr()
    meter(running, after)
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"_aws"')]
    (blob,) = lines
    assert (blob["GpuHours"], blob["GpuHoursLost"]) == ([8.0], [2.0])  # 2 h x 4 GPUs; 30 min after the commit
    assert (blob["DollarsSpent"], blob["DollarsLost"]) == ([6.0], [1.5])
    meter(after, after)  # the same stop again (a repeated event): counted once
    assert _emf(capsys.readouterr().out) == set() and store.reads == 1

    MeteredNotifications(FakeNotifier()).send_all([decision])
    count_jobs_by_state({JobState.RUNNING: 1})
    meter(running, after)
    for ns, name, dims in _emf(capsys.readouterr().out):
        assert ns == namespace
        assert frozenset(dims - {"service"}) in emitted[name] and "service" in dims, (name, dims)
