"""The local stack's front (emulator/front.py): Invoke answered by the handler on the caller's loop,
and nothing at all for a request that is not a signed AWS request to this very address (a web page in a
browser could otherwise submit a job whose command the local stack would run)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

from spotguard_cli.emulator.front import LambdaFront

SIGNED = {"Authorization": "AWS4-HMAC-SHA256 Credential=testing/20261126/us-east-1/lambda/aws4_request"}


def _post(front: LambdaFront, headers: dict[str, str], host: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{front.endpoint}/2015-03-31/functions/JobsFunction/invocations",
        data=json.dumps({"action": "list"}).encode(),
        headers={**headers, **({"Host": host} if host else {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_invoke_is_answered_by_the_handler_and_unsigned_or_foreign_requests_are_refused():
    seen: list[dict] = []
    front = LambdaFront(
        "http://127.0.0.1:9", {"JobsFunction": lambda e: seen.append(e) or {"ok": True}}
    ).start()
    stop = threading.Event()

    def loop() -> None:  # the local stack's loop, which runs the handlers
        while not stop.is_set():
            front.serve()
            stop.wait(0.01)

    runner = threading.Thread(target=loop, daemon=True)
    runner.start()
    try:
        assert _post(front, SIGNED) == (200, {"ok": True}) and seen == [{"action": "list"}]
        status, body = _post(front, {})  # what a web page can send
        assert status == 403 and "signed AWS requests only" in body["message"]
        status, _ = _post(front, SIGNED, host="evil.example:80")  # a name rebound to 127.0.0.1
        assert status == 403 and len(seen) == 1
    finally:
        stop.set()
        runner.join(timeout=5)
        front.close()
