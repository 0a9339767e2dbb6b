"""Faults injected into SpotGuard's own AWS calls, one call at a time, through botocore's event hooks.

Every call SpotGuard makes goes through the clients of `spotguard.adapters.clients`; the injector
hooks those (never the tests' own clients) and names each call by a label: the operation, and for
DynamoDB the table and the item's key shape (`PutItem:ledger:JOB/JOB`), so that `(label, nth)` picks
one call of a path, the same one in every run of it.

Where each kind of fault is put:
- throttle / 5xx: `before-send`, inside botocore's retry loop and ahead of moto (registered first), so
  botocore's standard retry mode sees a real error answer: `once` fails the call's first attempt (the
  retry must absorb it), `exhaust` fails every attempt (botocore gives up after URGENT's max_attempts
  and SpotGuard sees the error);
- lost: `after-call`, after moto carried the call out: the effect stands, the client sees a timeout;
- race (DynamoDB conditional writes): `before-send`, a twin of the same write goes in first through
  the tests' own client, so SpotGuard's write meets a condition that no longer holds, for real.

RunTask is answered by the GPU scheduler in `before-call`, ahead of botocore's retry loop: a fault on
it is raised there (SpotGuard sees it at once, so for RunTask `once` would be `exhaust`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import threading
import types
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from botocore import xform_name
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, ReadTimeoutError

from spotguard.adapters import clients

SERVICES = ("dynamodb", "ecs", "sqs", "sns", "events", "s3", "ec2", "ssm", "autoscaling")
ANSWERED_BEFORE_CALL = {"RunTask"}  # the GPU scheduler answers these in before-call
# botocore's `max_attempts` counts the retries, not the first try (`total_max_attempts` counts both)
MAX_ATTEMPTS = clients.URGENT.retries.get("total_max_attempts") or clients.URGENT.retries["max_attempts"] + 1

# (throttling code, status), (server error code, status) per service, as each service spells them
CODES: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {
    "dynamodb": (("ProvisionedThroughputExceededException", 400), ("InternalServerError", 500)),
    "ecs": (("ThrottlingException", 400), ("ServerException", 500)),
    "sqs": (("ThrottlingException", 400), ("ServiceUnavailable", 503)),
    "sns": (("Throttling", 400), ("InternalError", 500)),
    "eventbridge": (("ThrottlingException", 400), ("InternalException", 500)),
    "s3": (("SlowDown", 503), ("InternalError", 500)),
    "ec2": (("RequestLimitExceeded", 503), ("InternalError", 500)),
    "ssm": (("ThrottlingException", 400), ("InternalServerError", 500)),
    "auto-scaling": (("Throttling", 400), ("InternalFailure", 500)),
}

KINDS = ("throttle-once", "throttle-exhaust", "5xx-once", "5xx-exhaust", "lost", "race")
CONDITIONAL_WRITES = {"PutItem", "UpdateItem", "DeleteItem"}


def is_read(op: str) -> bool:
    return op.startswith(("Get", "List", "Describe", "Query", "Scan", "Head", "BatchGet"))


@dataclass(frozen=True)
class Call:
    op: str
    label: str
    nth: int  # 1 = the first call with this label since the injector was last reset
    params: dict[str, Any] = field(compare=False, hash=False, repr=False)

    @property
    def name(self) -> str:
        return f"{self.label}#{self.nth}"


def kinds_for(call: Call) -> list[str]:
    """The faults that make sense for one call."""
    if call.op in ANSWERED_BEFORE_CALL:
        return ["throttle-exhaust", "5xx-exhaust", "lost"]
    kinds = ["throttle-once", "throttle-exhaust", "5xx-once", "5xx-exhaust", "lost"]
    if call.op in CONDITIONAL_WRITES and "ConditionExpression" in call.params:  # DynamoDB's writes
        kinds.append("race")
    return kinds


def label_of(service: str, op: str, params: dict[str, Any], tables: dict[str, str]) -> str:
    """A call's stable name: the operation, and what it touches when that tells calls apart."""
    if service == "dynamodb":
        table = tables.get(str(params.get("TableName")), "table")
        item = params.get("Key") or params.get("Item") or {}
        if table == "ledger" and isinstance(item, dict) and "pk" in item:
            pk = next(iter(item["pk"].values()), "")
            sk = next(iter(item.get("sk", {"S": ""}).values()), "")
            return f"{op}:{table}:{str(pk).split('#', 1)[0]}/{str(sk).split('#', 1)[0]}"
        if op == "Query":
            values = params.get("ExpressionAttributeValues") or {}
            first = next((next(iter(v.values())) for v in values.values() if isinstance(v, dict)), "")
            return f"{op}:{table}:{str(first).split('#', 1)[0]}"
        return f"{op}:{table}"
    if service == "sqs" and "QueueUrl" in params:
        return f"{op}:{tables.get(str(params['QueueUrl']), 'queue')}"
    return op


def _error_response(protocol: str, status: int, code: str) -> AWSResponse:
    message = f"injected {code}"
    headers: dict[str, str] = {"x-amzn-RequestId": "fault-injection"}
    if protocol == "json":
        body = json.dumps({"__type": code, "message": message}).encode()
        headers["Content-Type"] = "application/x-amz-json-1.0"
    elif protocol == "query":
        body = (
            f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message>"
            "</Error><RequestId>fault-injection</RequestId></ErrorResponse>"
        ).encode()
    elif protocol == "ec2":
        body = (
            f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
            "<RequestID>fault-injection</RequestID></Response>"
        ).encode()
    else:  # rest-xml (S3)
        body = (
            f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>fault-injection</RequestId>"
            "</Error>"
        ).encode()
    return AWSResponse("https://fault-injection.invalid", status, headers, _Raw(body))


class _Raw:
    """What AWSResponse reads its body from (a urllib3 response, normally)."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


@dataclass
class Fault:
    label: str
    nth: int
    kind: str
    attempts: int = 0  # attempts of the target call that were failed
    fired: bool = False


class Injector:
    """Names every call SpotGuard makes, records what took effect, and injects at most one fault."""

    def __init__(self, twin: Callable[[str], Any], tables: dict[str, str]) -> None:
        self.twin = twin  # service -> the tests' own client (no hooks): a racing writer
        self.tables = tables  # table name or queue URL -> a short name for labels
        self.fault: Fault | None = None
        self.counts: Counter[str] = Counter()
        self.calls: list[Call] = []  # every call begun, in order
        self.effective: list[Call] = []  # every call that took effect (a 2xx answer)
        self._local = threading.local()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------ control
    def reset(self, fault: Fault | None = None) -> None:
        with self._lock:
            self.fault = fault
            self.counts.clear()
            self.calls.clear()
            self.effective.clear()

    def install(self) -> None:
        for service in SERVICES:
            events = clients.client(service).meta.events
            events.register_first("before-parameter-build", self._before_params)
            events.register_first("before-call", self._before_call)
            for op in ANSWERED_BEFORE_CALL:  # ahead of the scheduler's own, more specific, hook
                service_id = clients.client(service).meta.service_model.service_id.hyphenize()
                events.register_first(f"before-call.{service_id}.{op}", self._before_call)
            events.register_first("before-send", self._before_send)
            events.register("after-call", self._after_call)

    def ops(self) -> list[Call]:
        return list(self.calls)

    # -------------------------------------------------------------------------------------- hooks
    def _before_params(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        service = model.service_model.service_name
        context["fi_label"] = label_of(service, model.name, params, self.tables)
        context["fi_params"] = json.loads(json.dumps(params, default=str))
        context["fi_service"] = service

    def _before_call(self, model: Any, context: dict[str, Any], **_: Any) -> Any:
        if "fi_call" in context:  # the specific hook ran already
            return None
        label = context.get("fi_label", model.name)
        with self._lock:
            self.counts[label] += 1
            call = Call(model.name, label, self.counts[label], context.get("fi_params", {}))
            self.calls.append(call)
            target = self.fault is not None and (self.fault.label, self.fault.nth) == (label, call.nth)
        context["fi_call"] = call
        self._local.call = call
        self._local.target = target
        self._local.service_id = model.service_model.service_id.hyphenize()
        if target and model.name in ANSWERED_BEFORE_CALL:
            assert self.fault is not None
            if self.fault.kind in ("throttle-exhaust", "5xx-exhaust"):
                self.fault.fired, self.fault.attempts = True, 1
                code, _ = CODES[model.service_model.service_id.hyphenize()][
                    0 if self.fault.kind.startswith("throttle") else 1
                ]
                raise ClientError({"Error": {"Code": code, "Message": f"injected {code}"}}, model.name)
        return None

    def _before_send(self, request: Any, **_: Any) -> AWSResponse | None:
        if not getattr(self._local, "target", False) or self.fault is None:
            return None
        call: Call = self._local.call
        fault = self.fault
        if fault.kind == "race":
            if not fault.fired:
                fault.fired = True
                assert call.op in CONDITIONAL_WRITES, call
                with contextlib.suppress(ClientError):  # the twin may lose the race itself
                    getattr(self.twin("dynamodb"), xform_name(call.op))(**call.params)
            return None
        if fault.kind in ("throttle-once", "5xx-once") and fault.attempts >= 1:
            return None
        if fault.kind not in ("throttle-once", "throttle-exhaust", "5xx-once", "5xx-exhaust"):
            return None
        fault.fired = True
        fault.attempts += 1
        _ANSWERED.request = request  # moto's own before-send handler, which runs after this one, skips it
        service_id = self._local.service_id
        code, status = CODES[service_id][0 if fault.kind.startswith("throttle") else 1]
        return _error_response(_PROTOCOLS[service_id], status, code)

    def _after_call(self, http_response: Any, model: Any, context: dict[str, Any], **_: Any) -> None:
        call = context.get("fi_call")
        if call is None:
            return
        if http_response is not None and 200 <= http_response.status_code < 300:
            with self._lock:
                self.effective.append(call)
            fault = self.fault
            if (
                fault is not None
                and fault.kind == "lost"
                and (fault.label, fault.nth) == (call.label, call.nth)
            ):
                fault.fired = True
                raise ReadTimeoutError(endpoint_url=f"https://{model.service_model.endpoint_prefix}.invalid")


_PROTOCOLS = {
    "dynamodb": "json",
    "ecs": "json",
    "sqs": "json",
    "sns": "query",
    "eventbridge": "json",
    "s3": "rest-xml",
    "ec2": "ec2",
    "ssm": "json",
    "auto-scaling": "query",
}


_ANSWERED = threading.local()  # the request this thread's injector answered with an error


@contextlib.contextmanager
def moto_skips_answered_requests() -> Iterator[None]:
    """botocore calls every `before-send` handler and takes the first answer: moto would carry out a
    request the injector failed (a throttled write would still land). Make moto skip those."""
    import pytest
    from moto.core.botocore_stubber import BotocoreStubber

    real = BotocoreStubber.__call__

    def call(self: Any, event_name: str, request: Any, **kwargs: Any) -> Any:
        if getattr(_ANSWERED, "request", None) is request:
            _ANSWERED.request = None
            return None
        return real(self, event_name, request, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BotocoreStubber, "__call__", call)
        yield


# ------------------------------------------------------------------------------------ time passing
class _Shifted(_dt.datetime):
    offset = _dt.timedelta()

    @classmethod
    def now(cls, tz: _dt.tzinfo | None = None) -> _Shifted:  # type: ignore[override]
        return super().now(tz) + cls.offset


@contextlib.contextmanager
def powertools_clock() -> Iterator[type[_Shifted]]:
    """Powertools idempotency reads the time as `dt.datetime.now()`: give it a clock the tests move
    (an in-progress record expires when the visibility timeout has passed, as in AWS)."""
    import pytest
    from aws_lambda_powertools.utilities.idempotency.persistence import base, datarecord, dynamodb

    shim = types.SimpleNamespace(**{k: getattr(_dt, k) for k in dir(_dt) if not k.startswith("_")})
    shim.datetime = _Shifted
    _Shifted.offset = _dt.timedelta()
    with pytest.MonkeyPatch.context() as mp:
        for module in (base, datarecord, dynamodb):
            mp.setattr(module, "dt", shim)
        yield _Shifted
    _Shifted.offset = _dt.timedelta()
