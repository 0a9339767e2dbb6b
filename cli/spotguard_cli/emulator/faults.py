"""Faults injected into SpotGuard's own AWS calls, through botocore's event hooks: one chosen call at a time
(the fault tests, tests/faults/), or at every call with a seeded chance (`spotguard local soak --faults`).

Every call SpotGuard makes goes through the clients of `spotguard.adapters.clients`; the injector
hooks those (never a test's or the emulator's own clients) and names each call by a label: the
operation, and for DynamoDB the table and the item's key shape (`PutItem:ledger:JOB/JOB`), so that
`(label, nth)` picks one call of a path, the same one in every run of it.

Where each kind of fault is put:
- throttle / 5xx: `before-send`, inside botocore's retry loop and ahead of moto (registered first), so
  botocore's standard retry mode sees a real error answer: `once` fails the call's first attempt (the
  retry must absorb it), `exhaust` fails every attempt (botocore gives up after URGENT's max_attempts
  and SpotGuard sees the error);
- lost: `after-call`, after moto carried the call out: the effect stands, the client sees a timeout;
- lost-retried (the seeded mode only): `before-send`, the first attempt is carried out by moto and its
  answer lost (a read timeout), so botocore's standard retry mode sends the request again, as it does in
  AWS: a conditional write meets its own first write, a message is sent twice;
- race (DynamoDB conditional writes): `before-send`, a twin of the same write goes in first through
  the caller's own client, so SpotGuard's write meets a condition that no longer holds, for real;
- cut (the seeded mode only): `before-call`, before the call is sent: the invocation ends there, as a
  Lambda that timed out or crashed (`InvocationCut`, a BaseException, so that neither SpotGuard's own
  `except Exception` nor Powertools' batch processor takes it for a failed call). What its earlier calls
  did stands; the local Lambda hosts (emulator/lambdas.py) answer it as Lambda does.

RunTask is answered by the GPU scheduler in `before-call`, ahead of botocore's retry loop: a fault on
it is raised there (SpotGuard sees it at once, so for RunTask `once` would be `exhaust`).

The seeded mode (`Injector.seeded`) decides each call from the seed, the call's label and parameters
and how many times that very call was made before, not from the order of the calls: calls made side by
side on threads (the interruption function's) are decided the same in every run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from botocore import xform_name
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, ReadTimeoutError

from spotguard.adapters import clients
from spotguard_cli.emulator.clockpatch import patched

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
CUT = "cut"  # the seeded mode's own kinds: the invocation ends at this call;
LOST_RETRIED = "lost-retried"  # the first attempt's answer lost after it took effect, botocore sends it again
CONDITIONAL_WRITES = {"PutItem", "UpdateItem", "DeleteItem"}


class InvocationCut(BaseException):
    """The invocation ends here, as a Lambda that timed out or crashed: nothing after this point runs.
    A BaseException, so that no `except Exception` on the way (SpotGuard's, Powertools') takes it for a
    failed call; the local Lambda hosts catch it and answer as Lambda does."""


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
    """The faults that make sense for one call (the seeded mode adds its own: `seeded_kinds_for`)."""
    if call.op in ANSWERED_BEFORE_CALL:
        return ["throttle-exhaust", "5xx-exhaust", "lost"]
    kinds = ["throttle-once", "throttle-exhaust", "5xx-once", "5xx-exhaust", "lost"]
    if call.op in CONDITIONAL_WRITES and "ConditionExpression" in call.params:  # DynamoDB's writes
        kinds.append("race")
    return kinds


def seeded_kinds_for(call: Call) -> list[str]:
    """The seeded mode's faults for one call: those of `kinds_for`, a cut, and a lost answer that botocore
    retries (not for a call answered ahead of botocore's retry loop)."""
    retried = [] if call.op in ANSWERED_BEFORE_CALL else [LOST_RETRIED]
    return [*kinds_for(call), *retried, CUT]


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
    return AWSResponse("https://fault-injection.invalid", status, headers, RawBody(body))


class RawBody:
    """What AWSResponse reads its body from (a urllib3 response, normally): an answer made here."""

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


@dataclass
class Seeded:
    """The seeded mode: at every call in scope, a fault with chance `rate`, of a kind drawn among those
    that make sense for the call (`seeded_kinds_for`); `kinds` narrows them (None: all)."""

    rate: float
    seed: int
    say: Callable[[str], None] | None = None
    kinds: frozenset[str] | None = None
    in_scope: Callable[[], bool] = lambda: True  # e.g. only while a function's handler runs
    made: Counter[str] = field(default_factory=Counter)  # call fingerprint -> times made

    def draw(self, call: Call) -> str | None:
        """The fault for this call, or None: from the seed, the call and how often it was made before."""
        body = json.dumps(call.params, sort_keys=True, default=str)
        fingerprint = hashlib.sha256(f"{call.label}\0{body}".encode()).hexdigest()
        self.made[fingerprint] += 1
        chance = random.Random(f"{self.seed}:{fingerprint}:{self.made[fingerprint]}")
        if chance.random() >= self.rate:
            return None
        kinds = [k for k in seeded_kinds_for(call) if self.kinds is None or k in self.kinds]
        return chance.choice(kinds) if kinds else None


class Injector:
    """Names every call SpotGuard makes, records what took effect, and injects faults: at most one chosen
    call (`reset(fault)`), or calls drawn from a seed (`seeded`)."""

    def __init__(self, twin: Callable[[str], Any], tables: dict[str, str], record: bool = True) -> None:
        self.twin = twin  # service -> the caller's own client (no hooks): a racing writer
        self.tables = tables  # table name or queue URL -> a short name for labels
        self.record = record  # keep every call made and every call that took effect (`calls`, `effective`)
        self.fault: Fault | None = None
        self.mode: Seeded | None = None
        self.fired: Counter[str] = Counter()  # the seeded mode's faults that fired, by kind
        self.counts: Counter[str] = Counter()
        self.calls: list[Call] = []  # every call begun, in order
        self.effective: list[Call] = []  # every call that took effect (a 2xx answer)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._paused = 0

    # ------------------------------------------------------------------------------------ control
    def reset(self, fault: Fault | None = None) -> None:
        with self._lock:
            self.fault = fault
            self.counts.clear()
            self.calls.clear()
            self.effective.clear()

    def seeded(
        self,
        rate: float,
        chance: random.Random,
        say: Callable[[str], None] | None = None,
        kinds: frozenset[str] | None = None,
        in_scope: Callable[[], bool] | None = None,
    ) -> Seeded:
        """From now on, a fault at each call in scope with chance `rate` (its seed drawn from `chance`,
        so that the caller's seed decides them all); `say` hears a line for each that fires."""
        self.mode = Seeded(rate, chance.getrandbits(64), say, kinds, in_scope or (lambda: True))
        return self.mode

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No seeded fault meanwhile (the caller's own look at the system through SpotGuard's code)."""
        with self._lock:
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    def install(self, services: tuple[str, ...] = SERVICES) -> None:
        for service in services:
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
            if self.record:
                self.calls.append(call)
            target = self.fault is not None and (self.fault.label, self.fault.nth) == (label, call.nth)
            fault = self.fault if target else None
            mode = self.mode if not self._paused else None
        if fault is None and mode is not None and mode.in_scope():
            with self._lock:
                kind = mode.draw(call)
            if kind is not None:
                fault = Fault(label, call.nth, kind)
                self._fired(mode, fault, call)
        context["fi_call"], context["fi_fault"] = call, fault
        self._local.call = call
        self._local.fault = fault
        self._local.service_id = model.service_model.service_id.hyphenize()
        if fault is None:
            return None
        if fault.kind == CUT:
            fault.fired = True
            raise InvocationCut(f"the invocation was cut at {call.name}")
        if model.name in ANSWERED_BEFORE_CALL and fault.kind in ("throttle-exhaust", "5xx-exhaust"):
            fault.fired, fault.attempts = True, 1
            code, _ = CODES[self._local.service_id][0 if fault.kind.startswith("throttle") else 1]
            raise ClientError({"Error": {"Code": code, "Message": f"injected {code}"}}, model.name)
        return None

    def _fired(self, mode: Seeded, fault: Fault, call: Call) -> None:
        with self._lock:
            self.fired[fault.kind] += 1
        if mode.say is not None:
            mode.say(f"fault: {fault.kind} at {call.name}")

    def _before_send(self, request: Any, **_: Any) -> AWSResponse | None:
        fault: Fault | None = getattr(self._local, "fault", None)
        if fault is None:
            return None
        call: Call = self._local.call
        if fault.kind == "race":
            if not fault.fired:
                fault.fired = True
                assert call.op in CONDITIONAL_WRITES, call
                with contextlib.suppress(ClientError):  # the twin may lose the race itself
                    getattr(self.twin("dynamodb"), xform_name(call.op))(**call.params)
            return None
        if fault.kind == LOST_RETRIED:
            if fault.attempts == 0:
                from moto.core.models import botocore_stubber

                fault.fired, fault.attempts = True, 1
                botocore_stubber("before-send", request)  # the first attempt reaches AWS and takes effect
                raise ReadTimeoutError(endpoint_url=str(request.url))  # botocore retries this
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
        self._local.fault = None  # the call is over: a later one on this thread starts clean
        if http_response is not None and 200 <= http_response.status_code < 300:
            if self.record:
                with self._lock:
                    self.effective.append(call)
            fault: Fault | None = context.get("fi_fault")
            if fault is not None and fault.kind == "lost":
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
    from moto.core.botocore_stubber import BotocoreStubber

    real = BotocoreStubber.__call__

    def call(self: Any, event_name: str, request: Any, **kwargs: Any) -> Any:
        if getattr(_ANSWERED, "request", None) is request:
            _ANSWERED.request = None
            return None
        return real(self, event_name, request, **kwargs)

    with patched((BotocoreStubber, "__call__", call)):
        yield
