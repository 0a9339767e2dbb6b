"""Lambda played in this process: a function's handler with the stack's environment (`FunctionHost`),
and the SQS event source mapping that feeds it (`QueuePoller`).

moto cannot run Lambda code without Docker, so `FunctionHost` imports a function's app.py with exactly
the environment the stack gave the function. `QueuePoller` plays Lambda's SQS event source mapping: batch
size, partial batch responses (only the successes are deleted), the queue's own visibility timeout and
redrive to the dead-letter queue.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS
from spotguard_cli.emulator.stack import DeployedStack, FunctionConfig


class LambdaContext:
    """What Powertools reads from a Lambda context."""

    def __init__(self, fn: FunctionConfig, region: str, timeout_s: float = 30.0) -> None:
        self.function_name = fn.name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = 512
        self.invoked_function_arn = f"arn:aws:lambda:{region}:123456789012:function:{fn.name}"
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{fn.name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


class FunctionHost:
    """A function's handler, imported in this process with the environment the stack gave it."""

    def __init__(self, stack: DeployedStack, fn: FunctionConfig, log: TextIO | None = None) -> None:
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
        self.module = _import(fn.code_dir / f"{module_file}.py", f"spotguard_fn_{fn.logical_id}")
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
        context = LambdaContext(self.fn, self.stack.region)
        if self.log is None:
            return self.handler(event, context)
        with contextlib.redirect_stdout(self.log):  # EMF metric lines are printed to stdout
            return self.handler(event, context)


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

    def poll_once(self, wait_seconds: int = 0) -> tuple[int, int]:
        """(records delivered, records failed) for one batch."""
        resp = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=min(10, self.batch_size),
            WaitTimeSeconds=wait_seconds,
            AttributeNames=["All"],
        )
        messages = resp.get("Messages", [])
        if not messages:
            return 0, 0
        event = {"Records": [self._record(m) for m in messages]}
        self.delivered += [m["Body"] for m in messages]
        try:
            result = self.host.invoke(event) or {}
            failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
        except Exception:  # the invocation failed (Powertools raises when every record failed):
            failed = {m["MessageId"] for m in messages}  # Lambda leaves the whole batch to SQS
        done = [m for m in messages if m["MessageId"] not in failed]
        self.failed_receipts += [m["ReceiptHandle"] for m in messages if m["MessageId"] in failed]
        if done:
            self.sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)],
            )
        return len(messages), len(failed)

    def drain(self, max_batches: int = 1000) -> tuple[int, int]:
        """Poll until the queue has nothing visible."""
        total = failed = 0
        for _ in range(max_batches):
            n, f = self.poll_once()
            if n == 0:
                break
            total, failed = total + n, failed + f
        return total, failed

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
