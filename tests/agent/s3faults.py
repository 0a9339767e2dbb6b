"""S3 faults injected into one boto3 client with botocore's `before-send` hook, in front of moto server:
an error answer (throttling, 5xx, 403, 404), a timeout, a refused connection, or a lost answer (the
request reaches S3, the answer never comes back). botocore's own retry mode sees them as it would see
them from S3, so what is tested is the agent with its real retries, not a model of them.

    faults = S3Faults(client)
    rule = faults.add("GetObject", "slowdown", times=3, key="/0000000001/")  # the next 3 GetObjects of seq 1
    ...
    assert rule.hits == 3
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

import boto3
import urllib3
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from spotguard_cli.emulator.faults import RawBody

# name: (HTTP status, S3 error code)
ANSWERS = {
    "slowdown": (503, "SlowDown"),
    "unavailable": (503, "ServiceUnavailable"),
    "internal": (500, "InternalError"),
    "denied": (403, "AccessDenied"),
    "missing": (404, "NoSuchKey"),
    "nobucket": (404, "NoSuchBucket"),
}
KINDS = (*ANSWERS, "timeout", "connection", "lost")


@dataclass
class Rule:
    operation: str  # "GetObject", "PutObject", ... or "*"
    kind: str
    times: int | None  # None: every time
    key: str  # a part of the object key (or "" for any)
    hits: int = 0

    def matches(self, operation: str, url: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        return self.operation in ("*", operation) and self.key in urllib.parse.unquote(url)


class S3Faults:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.rules: list[Rule] = []
        self.calls: list[tuple[str, str]] = []  # (operation, url) of every request sent
        self._http = urllib3.PoolManager()
        client.meta.events.register_first("before-send.s3", self._on_send)

    def add(self, operation: str, kind: str, times: int | None = None, key: str = "") -> Rule:
        assert kind in KINDS, kind
        rule = Rule(operation, kind, times, key)
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()

    def _on_send(self, request: Any, event_name: str, **_: Any) -> AWSResponse | None:
        operation = event_name.rsplit(".", 1)[-1]
        self.calls.append((operation, request.url))
        rule = next((r for r in self.rules if r.matches(operation, request.url)), None)
        if rule is None:
            return None
        rule.hits += 1
        if rule.kind == "timeout":
            raise ReadTimeoutError(endpoint_url=request.url)
        if rule.kind == "connection":
            raise EndpointConnectionError(endpoint_url=request.url)
        if rule.kind == "lost":  # S3 gets it and acts on it; the answer is lost on the way back
            body = request.body.read() if hasattr(request.body, "read") else request.body
            headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
            self._http.request(request.method, request.url, body=body, headers=headers, retries=False)
            raise ReadTimeoutError(endpoint_url=request.url)
        status, code = ANSWERS[rule.kind]
        xml = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>injected</Message></Error>"
        return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, RawBody(xml.encode()))


def faulty_client(endpoint: str, max_attempts: int = 3) -> Any:
    """A client as the agent makes one (botocore's standard retry mode), with a few attempts only."""
    config = Config(retries={"mode": "standard", "max_attempts": max_attempts})
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config)
