"""What the local stack adds to moto so that concurrent callers see what AWS gives them.

moto's DynamoDB checks a write's condition and then writes, with nothing between them: two threads (moto
server answers each request in a thread of its own, and in-process moto runs in the caller's threads) can
both pass `attribute_not_exists(pk)` and both write. DynamoDB makes a conditional write atomic, and
SpotGuard's claims and compare-and-set writes rely on it. Since the interruption function handles the
records of a batch side by side and the local stack plays Lambda's concurrent invocations, the writes of
moto's DynamoDB are serialised here by one lock (reads need none).

Two more, for the local stack's boot model (boot.py), in moto server only:

- ECS's PROVISIONING tasks (`provision_task`, `place_task`): a task run with a capacity provider
  strategy that finds no instance waits, with its ARN, until an instance registers; moto has no such
  state (its RunTask places a task or none). Two operations of the local stack's own,
  `SpotguardProvisionTask` and `SpotguardPlaceTask`, reach them in moto server (`call_local_ecs`) on a
  route of their own, `/spotguard-local/`, that never passes through moto's ECS dispatch.
- An Auto Scaling group's instances as its MixedInstancesPolicy launches them (`launched_as_pools`):
  moto takes their type from the launch template (which names none, so ``) and ignores the spot
  share; AWS launches the overrides' type, as spot instances when no on-demand share is asked.

And one for speed, in this process only (`quicker_dynamodb_scans`): moto's DynamoDB sorts every item of
a table for each Query and Scan by comparing its key objects, which converts both keys at every
comparison; a long run on the virtual clock spent most of its time there.

`python -m spotguard_cli.emulator.motopatch -H 127.0.0.1 -p PORT` is moto server with these in place.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

_WRITES = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
_lock = threading.RLock()


def atomic_dynamodb_writes() -> None:
    """Serialise moto's DynamoDB writes (idempotent: the methods are wrapped once per process)."""
    from moto.dynamodb.models import DynamoDBBackend

    for name in _WRITES:
        method = getattr(DynamoDBBackend, name, None)
        if method is None or getattr(method, "_spotguard_atomic", False):
            continue
        setattr(DynamoDBBackend, name, _locked(method))


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def write(*args: Any, **kwargs: Any) -> Any:
        with _lock:
            return method(*args, **kwargs)

    write._spotguard_atomic = True  # type: ignore[attr-defined]
    return write


# ================================================================ moto, quicker (long virtual runs)
# the hash key a Query of a table (not an index) is about, while it runs: only its items can answer
_QUERIED_HASH: contextvars.ContextVar[Any] = contextvars.ContextVar("queried_hash", default=None)


@contextlib.contextmanager
def quicker_dynamodb_scans() -> Iterator[None]:
    """moto's DynamoDB's `Table.all_items` (under every Query and Scan) in the same order, each item's keys
    converted once (a sort key) instead of at every comparison; and a Query of a table's own keys reads
    only its hash key's items (moto sorted the whole table, then kept those: with thousands of items in
    the ledger, most of a long soak's time). The same answers, in the same order; as it was on the way
    out."""
    from moto.dynamodb.models.table import Table

    real_all, real_query = Table.all_items, Table.query

    def all_items(self: Any) -> list[Any]:
        if self.range_key_attr:
            queried = _QUERIED_HASH.get()
            if queried is not None:  # moto keeps the items of this hash key only, then sorts by range
                return sorted(self.items.get(queried, {}).values(), key=lambda x: x.range_key.cast_value)
            items = [item for hash_set in self.items.values() for item in hash_set.values()]
            return sorted(items, key=lambda x: (x.hash_key.cast_value, x.range_key.cast_value))
        return sorted(self.items.values(), key=lambda x: x.hash_key.cast_value)

    def query(self: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        # Table.query(hash_key, range_comparison, range_objs, limit, exclusive_start_key,
        # scan_index_forward, projection_expressions, index_name, ...)
        index_name = kwargs["index_name"] if "index_name" in kwargs else (args[6] if len(args) > 6 else None)
        token = _QUERIED_HASH.set(hash_key if index_name is None else None)
        try:
            return real_query(self, hash_key, *args, **kwargs)
        finally:
            _QUERIED_HASH.reset(token)

    Table.all_items = all_items  # type: ignore[method-assign]
    Table.query = query  # type: ignore[method-assign]
    try:
        yield
    finally:
        Table.all_items, Table.query = real_all, real_query  # type: ignore[method-assign]


@contextlib.contextmanager
def quicker_dispatch() -> Iterator[None]:
    """moto's request dispatch with two pure lookups remembered: a response class's method names (it
    listed the class's members with `inspect.getmembers` at every request) and camelCase to snake_case
    (at every request, and at every attribute of an SQS queue at each send to it). The same answers;
    as it was on the way out."""
    import moto.core.responses as responses
    from moto.core import utils

    real_names, real_snake = utils.method_names_from_class, utils.camelcase_to_underscores
    names = functools.lru_cache(maxsize=None)(real_names)
    snake = functools.lru_cache(maxsize=4096)(real_snake)
    bound = [m for name, m in list(sys.modules.items()) if name.startswith("moto.") and m is not None]
    patched = [m for m in bound if getattr(m, "camelcase_to_underscores", None) is real_snake]
    responses.method_names_from_class = names  # type: ignore[attr-defined]
    for module in patched:
        module.camelcase_to_underscores = snake  # type: ignore[attr-defined]
    try:
        yield
    finally:
        responses.method_names_from_class = real_names  # type: ignore[attr-defined]
        for module in patched:
            module.camelcase_to_underscores = real_snake  # type: ignore[attr-defined]


# ================================================================ ECS tasks waiting for an instance
LOCAL_OPERATIONS = ("SpotguardProvisionTask", "SpotguardPlaceTask")


def provision_task(backend: Any, request: dict[str, Any]) -> str:
    """A task of a RunTask `request` (with a capacity provider strategy) that no instance takes yet:
    lastStatus PROVISIONING, no container instance, as ECS keeps it while managed scaling adds one.
    Its ARN."""
    from moto.ecs.models import Task

    cluster = backend._get_cluster(request.get("cluster") or "default")
    definition = backend.describe_task_definition(request["taskDefinition"])
    strategy = request.get("capacityProviderStrategy") or []
    task = Task(
        cluster,
        definition,
        None,
        backend._calculate_task_resource_requirements(definition),
        backend=backend,
        group=request.get("group") or f"family:{definition.family}",
        launch_type="EC2",
        overrides=request.get("overrides") or {},
        started_by=request.get("startedBy") or "",
        tags=request.get("tags") or [],
        capacity_provider_name=strategy[0]["capacityProvider"] if strategy else None,
    )
    task.last_status = "PROVISIONING"
    backend.tasks.setdefault(cluster.name, {})[task.task_arn] = task
    return str(task.task_arn)


def place_task(backend: Any, cluster_name: str, task_arn: str, container_instance_arn: str) -> None:
    """The waiting task is placed on the container instance: it holds its resources there (and counts
    in its runningTasksCount, as moto counts a task it placed) and is RUNNING, as moto's own are."""
    cluster = backend._get_cluster(cluster_name)
    task = backend.tasks[cluster.name][task_arn]
    if task.container_instance_arn is not None:
        raise ValueError(f"task {task_arn} is placed already")
    instance = backend.container_instances[cluster.name][container_instance_arn.split("/")[-1]]
    task.container_instance_arn = instance.container_instance_arn
    backend.update_container_instance_resources(instance, task.resource_requirements)
    task.last_status = "RUNNING"


# The local stack's own operations travel on a route of their own, `/spotguard-local/<operation>` (as
# moto's own `/moto-api/` does), answered here before moto's dispatch sees the request: moto's ECS may
# refuse an action it does not know in any release (5.2.6 answers 404 to one), so nothing of ours rides
# on it. The body is a JSON object with the region; the answer a JSON object, or {"error": ...} with 400.
LOCAL_PREFIX = "/spotguard-local/"
_MAX_LOCAL_BODY = 1 << 20  # a RunTask request is far smaller; a larger body is refused unread


def _ecs_backend(region: str) -> Any:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ecs.models import ecs_backends

    return ecs_backends[DEFAULT_ACCOUNT_ID][region]


def answer_local_operation(operation: str, body: dict[str, Any]) -> dict[str, Any]:
    """One of LOCAL_OPERATIONS on this process's moto, for the region the body names; its answer."""
    backend = _ecs_backend(str(body["region"]))
    if operation == "SpotguardProvisionTask":
        return {"taskArn": provision_task(backend, body["request"])}
    if operation == "SpotguardPlaceTask":
        place_task(backend, body["cluster"], body["task"], body["containerInstance"])
        return {}
    raise ValueError(f"not a local operation: {operation}")


class LocalOperations:
    """A WSGI application: `/spotguard-local/<operation>` answered by `answer_local_operation`, every
    other request handed to moto's `app`."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = str(environ.get("PATH_INFO", ""))
        if not path.startswith(LOCAL_PREFIX):
            return self.app(environ, start_response)
        operation = path[len(LOCAL_PREFIX) :].strip("/")
        status, answer = "200 OK", {}
        if environ.get("REQUEST_METHOD") != "POST" or operation not in LOCAL_OPERATIONS:
            known = ", ".join(LOCAL_OPERATIONS)
            refusal = f"no local operation {operation!r} (POST one of {known})"
            status, answer = "404 Not Found", {"error": refusal}
        else:
            try:
                length = int(environ.get("CONTENT_LENGTH") or 0)
                if not 0 < length <= _MAX_LOCAL_BODY:
                    raise ValueError(f"a local operation's body is 1 to {_MAX_LOCAL_BODY} bytes: {length}")
                body = json.loads(environ["wsgi.input"].read(length))
                if not isinstance(body, dict):
                    raise ValueError("a local operation's body is a JSON object")
                answer = answer_local_operation(operation, body)
            except Exception as e:  # the caller is told in one line, as moto tells its own errors
                message = getattr(e, "message", None) or str(e)
                status, answer = "400 Bad Request", {"error": f"{type(e).__name__}: {message}"}
        data = json.dumps(answer).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]


def call_local_ecs(endpoint: str, region: str, operation: str, body: dict[str, Any]) -> dict[str, Any]:
    """One of LOCAL_OPERATIONS on moto server at `endpoint` (127.0.0.1, started by `main`); its answer.
    `body` is the operation's own: a RunTask request to provision, or cluster, task and container instance
    to place."""
    if operation not in LOCAL_OPERATIONS:
        raise ValueError(f"not a local operation: {operation}")
    if operation == "SpotguardProvisionTask":
        payload = {"region": region, "request": body}
    else:
        payload = {**body, "region": region}
    request = urllib.request.Request(
        endpoint.rstrip("/") + LOCAL_PREFIX + operation,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            answer = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:500]
        raise RuntimeError(f"moto server refused {operation} ({e.code}): {detail}") from None
    return dict(answer)


# ============================================================= Auto Scaling groups' instances
def launched_as_pools(method: Callable[..., Any]) -> Callable[..., Any]:
    """moto's FakeAutoScalingGroup.replace_autoscaling_group_instances, with the instances it launches
    given the MixedInstancesPolicy's first override's type and, when the policy asks no on-demand
    share above a base of 0, the spot lifecycle."""
    if getattr(method, "_spotguard_pools", False):
        return method

    @functools.wraps(method)
    def launch(group: Any, count_needed: int, propagated_tags: dict[str, str]) -> Any:
        before = {s.instance.id for s in group.instance_states}
        result = method(group, count_needed, propagated_tags)
        policy = group.mixed_instances_policy or {}
        overrides = (policy.get("LaunchTemplate") or {}).get("Overrides") or []
        distribution = policy.get("InstancesDistribution") or {}
        spot = (
            bool(policy)
            and int(distribution.get("OnDemandBaseCapacity", 0)) == 0
            and int(distribution.get("OnDemandPercentageAboveBaseCapacity", 100)) == 0
        )
        for state in group.instance_states:
            if state.instance.id in before:
                continue
            if overrides and overrides[0].get("InstanceType"):
                state.instance.instance_type = state.instance_type = overrides[0]["InstanceType"]
            if spot:
                state.instance.lifecycle = "spot"
        return result

    launch._spotguard_pools = True  # type: ignore[attr-defined]
    return launch


def pool_instances() -> None:
    """Install `launched_as_pools` on moto's Auto Scaling groups (idempotent)."""
    from moto.autoscaling.models import FakeAutoScalingGroup

    FakeAutoScalingGroup.replace_autoscaling_group_instances = launched_as_pools(
        FakeAutoScalingGroup.replace_autoscaling_group_instances
    )


def main(argv: list[str] | None = None) -> None:
    """moto server on `-H HOST -p PORT` with the patches above and the local operations' route: moto's
    own dispatcher and app factory under werkzeug's threaded server, as `moto.server.main` runs them."""
    import argparse
    import signal

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    parser = argparse.ArgumentParser(prog="spotguard_cli.emulator.motopatch")
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("MOTO_PORT", str(args.port))  # moto's own requests to itself
    atomic_dynamodb_writes()
    pool_instances()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = LocalOperations(DomainDispatcherApplication(create_backend_app))
    run_simple(args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
