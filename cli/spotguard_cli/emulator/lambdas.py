"""Lambda played in this process: a function's handler with the stack's environment (`FunctionHost`),
and the SQS event source mapping that feeds it (`QueuePoller`).

moto cannot run Lambda code without Docker, so `FunctionHost` imports a function's app.py with exactly
the environment the stack gave the function. `QueuePoller` plays Lambda's SQS event source mapping: batch
size, partial batch responses (only the successes are deleted), the queue's own visibility timeout and
redrive to the dead-letter queue.

With `concurrent=True` it also plays the mapping's concurrency (`Scaling`): as AWS documents it for a
standard queue, five batches at once when messages are there, up to 300 more concurrent invocations a
minute while messages remain, at most 1,000, capped by the mapping's MaximumConcurrency and the function's
reserved concurrency. Each concurrent invocation runs in an execution environment of its own (the
function's app.py imported once per environment, so its module state, e.g. Powertools' batch processor,
is never shared by two invocations at once), in a thread; environments are kept and reused, as Lambda
keeps warm ones. The clients (thread-safe) and every hook on them are shared, as in one process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from spotguard.domain import clock
from spotguard_cli.emulator.faults import InvocationCut
from spotguard_cli.emulator.iam import RUNNING
from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS
from spotguard_cli.emulator.scaling import Invocation, Scaling
from spotguard_cli.emulator.stack import DeployedStack, FunctionConfig


class LambdaContext:
    """What Powertools reads from a Lambda context."""

    def __init__(self, fn: FunctionConfig, region: str, timeout_s: float = 30.0) -> None:
        self.function_name = fn.name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = fn.memory_mb
        self.invoked_function_arn = f"arn:aws:lambda:{region}:123456789012:function:{fn.name}"
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{fn.name}"
        self.log_stream_name = "local"
        # on SpotGuard's clock: a virtual clock (emulator/vclock.py) gives every invocation its whole time,
        # the same in every run (the interruption function's leases are written from it, Powertools'
        # idempotency records expire by it), and takes it away only as the virtual clock moves
        self._deadline = clock.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - clock.monotonic()) * 1000))


_environments = itertools.count(1)


class InvocationFailed(Exception):
    """Lambda's answer to an invocation that timed out or crashed (emulator/faults.py's `InvocationCut`):
    a direct invoke's caller gets a function error (`FunctionError: Unhandled`), an SQS event source
    mapping leaves the whole batch on the queue."""


class FunctionHost:
    """A function's handler, imported in this process with the environment the stack gave it. `fresh`:
    import app.py anew, as a second execution environment of the function (its own module state)."""

    def __init__(
        self, stack: DeployedStack, fn: FunctionConfig, log: TextIO | None = None, fresh: bool = False
    ) -> None:
        self.stack = stack
        self.fn = fn
        self.log = log
        os.environ.update(fn.environment)
        os.environ.update(FAKE_CREDENTIALS)
        os.environ["AWS_DEFAULT_REGION"] = stack.region
        if stack.endpoint:
            os.environ["AWS_ENDPOINT_URL"] = stack.endpoint
        os.environ.setdefault("POWERTOOLS_DEV", "false")
        module_file, _, func = fn.handler.rpartition(".")
        name = f"spotguard_fn_{fn.logical_id}" + (f"_env{next(_environments)}" if fresh else "")
        self.module = _import(fn.code_dir / f"{module_file}.py", name)
        self.handler = getattr(self.module, func)
        logger = getattr(self.module, "logger", None)
        if log is not None and logger is not None:
            # the function's log lines, as CloudWatch would keep them (the handler may still hold the
            # closed file of an earlier local stack in this process: replace it without flushing it)
            handler = logger.registered_handler
            if getattr(handler.stream, "closed", False):
                handler.stream = log
            else:
                handler.setStream(log)

    def invoke(self, event: dict[str, Any]) -> Any:
        """The handler's answer; InvocationFailed when the invocation was cut (timed out or crashed: what
        its calls did so far stands, the rest never happens)."""
        context = LambdaContext(self.fn, self.stack.region)
        running = RUNNING.set(self.fn.logical_id)  # its calls are held to its role (iam.RoleGuard)
        try:
            if self.log is None:
                return self.handler(event, context)
            with _stdout_to(self.log):  # EMF metric lines are printed to stdout
                return self.handler(event, context)
        except InvocationCut as cut:
            raise InvocationFailed(f"{self.fn.logical_id}: {cut}") from cut
        finally:
            RUNNING.reset(running)


class _ThreadStdout:
    """sys.stdout, with a target per thread: invocations side by side each print to their function's
    log (contextlib.redirect_stdout swaps sys.stdout for every thread at once)."""

    def __init__(self, default: TextIO) -> None:
        self.default = default
        self.latest: TextIO | None = None  # the log of an invocation in progress
        self.active = 0  # invocations in progress
        self.local = threading.local()

    def _target(self) -> TextIO:
        # a thread of the invocation's own (a batch's records side by side) prints to the latest log
        return getattr(self.local, "target", None) or self.latest or self.default

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


_stdout_lock = threading.Lock()


@contextlib.contextmanager
def _stdout_to(log: TextIO) -> Iterator[None]:
    with _stdout_lock:
        if not isinstance(sys.stdout, _ThreadStdout):
            sys.stdout = _ThreadStdout(sys.stdout)
        proxy = sys.stdout
    before = getattr(proxy.local, "target", None)
    with _stdout_lock:
        proxy.local.target = proxy.latest = log
        proxy.active += 1
    try:
        yield
    finally:
        with _stdout_lock:
            proxy.local.target = before
            proxy.active -= 1
            if proxy.active == 0:
                proxy.latest = None


def _import(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _as_eventbridge_delivers(body: str, account: str) -> str:
    """moto's EventBridge leaves `account` out of the events it delivers to SQS; AWS always sends it.
    Put it back, so the handler sees what it would see in AWS (and its strict parsing stays strict)."""
    try:
        event = json.loads(body)
    except ValueError:
        return body
    if isinstance(event, dict) and "detail-type" in event and "account" not in event:
        event["account"] = account
        return json.dumps(event)
    return body


class QueuePoller:
    """One SQS event source mapping: receive a batch, invoke, delete what succeeded."""

    def __init__(self, stack: DeployedStack, host: FunctionHost, queue_arn: str | None = None) -> None:
        queue_arn = queue_arn or host.fn.queue_arn
        if queue_arn is None:
            raise ValueError(f"{host.fn.logical_id} has no SQS event source")
        self.host = host
        self.sqs = stack.client("sqs")
        name = queue_arn.rsplit(":", 1)[-1]
        self.queue_url = self.sqs.get_queue_url(QueueName=name)["QueueUrl"]
        self.queue_arn = queue_arn
        self.batch_size = host.fn.queues.get(queue_arn, host.fn.batch_size)
        self.region = stack.region
        self.delivered: list[str] = []  # every body handed to the function, in order
        self.failed_receipts: list[str] = []  # records the function reported failed (SQS redelivers them)
        self.stack = stack
        self.scaling = Scaling.of(host.fn, queue_arn)
        self.concurrent = False  # True: drain() plays the mapping's concurrency (see Scaling)
        self.peak_concurrency = 0  # the most invocations seen at once
        self._idle: list[FunctionHost] = [host]  # execution environments not in an invocation
        self._lock = threading.Lock()
        self._lambda: ThreadPoolExecutor | None = None

    def poll_once(self, wait_seconds: int = 0) -> tuple[int, int]:
        """(records delivered, records failed) for one batch."""
        messages = self._receive(wait_seconds)
        return self._invoke(messages, self.host) if messages else (0, 0)

    def drain(self, max_batches: int = 1000) -> tuple[int, int]:
        """Poll until the queue has nothing visible (batch after batch, or as Lambda's concurrency does
        when `concurrent` is set)."""
        if self.concurrent:
            return self._drain_concurrently(max_batches)
        total = failed = 0
        for _ in range(max_batches):
            n, f = self.poll_once()
            if n == 0:
                break
            total, failed = total + n, failed + f
        return total, failed

    # -------------------------------------------------------------------------------- internals
    def _receive(self, wait_seconds: int = 0) -> list[dict[str, Any]]:
        resp = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=min(10, self.batch_size),
            WaitTimeSeconds=wait_seconds,
            AttributeNames=["All"],
        )
        return list(resp.get("Messages", []))

    def _invoke(self, messages: list[dict[str, Any]], host: FunctionHost) -> tuple[int, int]:
        event = {"Records": [self._record(m) for m in messages]}
        with self._lock:
            self.delivered += [m["Body"] for m in messages]
        try:
            result = host.invoke(event) or {}
            failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
        except Exception:  # the invocation failed (Powertools raises when every record failed), or timed
            # out or crashed (InvocationFailed): Lambda leaves the whole batch to SQS, which hands it back
            # after the visibility timeout (and to the dead-letter queue after maxReceiveCount)
            failed = {m["MessageId"] for m in messages}
        done = [m for m in messages if m["MessageId"] not in failed]
        with self._lock:
            self.failed_receipts += [m["ReceiptHandle"] for m in messages if m["MessageId"] in failed]
        if done:
            self.sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)],
            )
        return len(messages), len(failed)

    def _drain_concurrently(self, max_batches: int) -> tuple[int, int]:
        """Lambda's pollers: up to `scaling.allowed(t)` invocations at once, t the time since this burst
        of messages began; a new batch is received whenever one finishes or the allowance grows."""
        if self._lambda is None:
            self._lambda = ThreadPoolExecutor(
                max_workers=self.scaling.limit, thread_name_prefix=f"lambda-{self.host.fn.logical_id}"
            )
        started = time.monotonic()
        running: set[Future[tuple[int, int]]] = set()
        total = failed = batches = 0
        empty = False
        while True:
            allowed = self.scaling.allowed(time.monotonic() - started)
            while not empty and len(running) < allowed and batches < max_batches:
                messages = self._receive()
                if not messages:
                    empty = True
                    break
                batches += 1
                running.add(self._lambda.submit(self._in_environment, messages))
                self.peak_concurrency = max(self.peak_concurrency, len(running))
            if not running:
                break
            done, running = wait(running, timeout=self.scaling.step_seconds, return_when=FIRST_COMPLETED)
            for f in done:
                n, k = f.result()
                total, failed = total + n, failed + k
            if done:
                empty = False  # an invocation ended: look again (failed records come back later)
        return total, failed

    def drain_one_by_one(self, max_batches: int = 1000) -> tuple[list[Invocation], int]:
        """Every batch alone, one after another, each timed: what an invocation takes with the machine to
        itself, as each Lambda execution environment has a vCPU of its own and AWS's services do not slow
        down for a few hundred callers. `Scaling.schedule` then places the invocations as Lambda's
        concurrency would (bench/local_load.py --isolated). Returns the invocations and the records failed."""
        invocations: list[Invocation] = []
        failed = 0
        for _ in range(max_batches):
            messages = self._receive()
            if not messages:
                break
            started = time.monotonic()
            _, f = self._invoke(messages, self.host)
            invocations.append(Invocation(tuple(m["Body"] for m in messages), started, time.monotonic()))
            failed += f
        return invocations, failed

    def _in_environment(self, messages: list[dict[str, Any]]) -> tuple[int, int]:
        with self._lock:
            host = self._idle.pop() if self._idle else None
        if host is None:  # a new execution environment: the function's cold start
            host = FunctionHost(self.stack, self.host.fn, log=self.host.log, fresh=True)
        try:
            return self._invoke(messages, host)
        finally:
            with self._lock:
                self._idle.append(host)

    def _record(self, m: dict[str, Any]) -> dict[str, Any]:
        return {
            "messageId": m["MessageId"],
            "receiptHandle": m["ReceiptHandle"],
            "body": _as_eventbridge_delivers(m["Body"], self.queue_arn.split(":")[4]),
            "attributes": m.get("Attributes", {}),
            "messageAttributes": m.get("MessageAttributes", {}),
            "md5OfBody": m.get("MD5OfBody", ""),
            "eventSource": "aws:sqs",
            "eventSourceARN": self.queue_arn,
            "awsRegion": self.region,
        }
