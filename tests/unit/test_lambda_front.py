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


def _raw(front: LambdaFront, head: str, body: bytes = b"", wait: float = 5.0) -> bytes:
    """A request written by hand on a socket (what urllib would not send); what came back."""
    import socket

    port = int(front.endpoint.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as conn:
        conn.sendall(head.encode() + b"\r\n\r\n" + body)
        conn.shutdown(socket.SHUT_WR) if not body else None
        data = b""
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except TimeoutError:
            pass
        return data


def test_bodies_are_bounded_and_refused_from_the_headers_before_they_are_read(capsys, monkeypatch):
    """Issue 45, item 8: an unsigned 300 MiB POST was read whole before it was refused; `Content-Length:
    abc` was a server traceback and nothing to the client; -1 blocked; each dropped client a traceback."""
    import socket
    import time

    from spotguard_cli.emulator import front as front_module

    monkeypatch.setattr(front_module, "SOCKET_TIMEOUT_SECONDS", 0.5)
    front = LambdaFront("http://127.0.0.1:9", {"JobsFunction": lambda e: {"ok": True}}).start()
    host = front.endpoint.removeprefix("http://")
    path = "POST /2015-03-31/functions/JobsFunction/invocations HTTP/1.1"
    try:
        # unsigned, 300 MiB announced, a few bytes sent: refused at once, the connection closed
        started = time.monotonic()
        answer = _raw(front, f"{path}\r\nHost: evil.example\r\nContent-Length: {300 << 20}", b"x" * 1000)
        assert answer.startswith(b"HTTP/1.1 403") and time.monotonic() - started < 5
        signed = f"{path}\r\nHost: {host}\r\nAuthorization: {SIGNED['Authorization']}"
        for length, status in (("abc", b"400"), ("-1", b"400"), (str(7 << 20), b"413")):
            answer = _raw(front, f"{signed}\r\nContent-Length: {length}")
            assert answer.startswith(b"HTTP/1.1 " + status), (length, answer[:200])
        answer = _raw(front, f"{signed}\r\nTransfer-Encoding: chunked")
        assert answer.startswith(b"HTTP/1.1 411")
        # a client that says 100 bytes and sends 10, then hangs up: dropped, quietly
        port = int(front.endpoint.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(f"{signed}\r\nContent-Length: 100\r\n\r\n".encode() + b"x" * 10)
        # a client that sends half its headers and goes silent is dropped after the socket timeout
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(path.encode() + b"\r\nHost: ")
            started = time.monotonic()
            assert conn.recv(100) == b"" and time.monotonic() - started < 3  # closed by the front
        time.sleep(0.2)
        assert "Traceback" not in capsys.readouterr().err
    finally:
        front.close()
