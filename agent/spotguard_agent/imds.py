"""Watch the instance metadata service (IMDSv2) for what the instance itself is told: a spot
`instance-action` (stop, checkpoint and exit 75) and a rebalance recommendation (checkpoint and go on).

Polled in a background thread while reachable; off EC2 (no answer to the token request) it stops
quietly. The endpoint is botocore's own setting, AWS_EC2_METADATA_SERVICE_ENDPOINT, so tests can point
it at a local stand-in.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime

log = logging.getLogger("spotguard.agent")

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL = 21600


class MetadataWatcher:
    def __init__(
        self,
        on_stop: Callable[[str], None],
        on_rebalance: Callable[[str], None],
        endpoint: str | None = None,
        poll_seconds: float = 5.0,
        timeout: float = 1.0,
    ) -> None:
        self.endpoint = (
            endpoint or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or DEFAULT_ENDPOINT
        ).rstrip("/")
        self.on_stop, self.on_rebalance = on_stop, on_rebalance
        self.poll_seconds, self.timeout = poll_seconds, timeout
        self._token: str | None = None
        self._seen_rebalance: str | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.reachable: bool | None = None
        # When the spot instance-action says the instance goes (Unix time), once it has been seen: the
        # deadline of the checkpoint that follows.
        self.action_time: float | None = None

    def start(self) -> MetadataWatcher:
        self._thread = threading.Thread(target=self._loop, name="spotguard-imds", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout * 3 + self.poll_seconds)

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        req = urllib.request.Request(f"{self.endpoint}{path}", method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""

    def _refresh_token(self) -> bool:
        try:
            status, body = self._request(
                "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)}
            )
        except (OSError, ValueError):
            return False
        self._token = body if status == 200 and body else None
        return self._token is not None

    def _get(self, path: str) -> tuple[int, str]:
        assert self._token is not None
        status, body = self._request("GET", path, {"X-aws-ec2-metadata-token": self._token})
        if status == 401 and self._refresh_token():  # the token expired
            status, body = self._request("GET", path, {"X-aws-ec2-metadata-token": self._token or ""})
        return status, body

    def check(self) -> None:
        """One look at the metadata (what each poll does)."""
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:
            action = _field(body, "action") or "terminate"
            self.action_time = _unix_time(_field(body, "time"))
            self.on_stop(f"spot instance-action {action} at {_field(body, 'time')}")
            self._stopped.set()
            return
        status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200:
            when = _field(body, "noticeTime") or body
            if when != self._seen_rebalance:
                self._seen_rebalance = when
                self.on_rebalance(f"rebalance recommendation at {when}")

    def _loop(self) -> None:
        if not self._refresh_token():
            self.reachable = False
            log.debug("instance metadata not reachable at %s: not watching it", self.endpoint)
            return
        self.reachable = True
        while not self._stopped.is_set():
            try:
                self.check()
            except (OSError, ValueError) as exc:
                log.debug("instance metadata poll failed: %s", exc)
            self._stopped.wait(self.poll_seconds)


def _field(body: str, name: str) -> str | None:
    try:
        value = json.loads(body).get(name)
    except (ValueError, AttributeError):
        return None
    return str(value) if value is not None else None


def _unix_time(value: str | None) -> float | None:
    """An instance-action's `time` ("2026-11-22T08:22:00Z") as Unix time; None when it is not one."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
