"""The local stack's front door for the CLI and the AWS SDKs: one endpoint on 127.0.0.1 where Lambda's
Invoke of the stack's functions is answered by the local system's own handlers, and every other request
is passed to moto server as it is.

moto server has the stack's functions (CloudFormation made them), but its Invoke would start Docker, while
the local stack runs the handlers in its own process. So `spotguard local up` starts this front and says
to point `AWS_ENDPOINT_URL` at it: `spotguard jobs submit|list|status|logs|cancel` (and `aws lambda
invoke`, boto3) then work against the local stack exactly as against AWS, the stack found from
CloudFormation and the function invoked by its name.

An invocation is not run on the front's thread: it is queued for the local system's loop (`serve`, which
`local up` calls between its rounds), so a handler never runs beside the pollers' in another thread.
"""

from __future__ import annotations

import http.client
import json
import queue
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

INVOKE = re.compile(r"^/2015-03-31/functions/(?P<name>[^/]+)/invocations$")
INVOKE_TIMEOUT_SECONDS = 120.0
# Bounds on what a client may hold: a request's headers and body must come within this many seconds of
# silence each (a slow or stalled client is dropped, not given a thread for good), and a body is at most
# Lambda's synchronous payload (an Invoke) or MAX_BODY (anything passed to moto: an S3 upload in one part).
SOCKET_TIMEOUT_SECONDS = 30.0
MAX_INVOKE_BODY = 6 * 1024 * 1024
MAX_BODY = 64 * 1024 * 1024
# what is not passed on to moto: hop-by-hop headers, and the length (set again for the body)
_NOT_PASSED = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}

Handler = Callable[[dict[str, Any]], Any]


class LambdaFront:
    """`handlers`: the stack's functions by their names (physical, as CloudFormation gave them, and the
    template's logical ids), each answering an event. `moto`: moto server's endpoint."""

    def __init__(self, moto: str, handlers: dict[str, Handler], port: int = 0) -> None:
        self.moto = urlsplit(moto)
        self.handlers = handlers
        self.pending: queue.Queue[tuple[Handler, Any, Future[Any]]] = queue.Queue()
        front = self

        class Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = SOCKET_TIMEOUT_SECONDS  # on the connection's socket: reads and writes

            def do_POST(self) -> None:
                front.answer(self)

            do_GET = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the local stack prints its own timeline

        self.server = _QuietServer(("127.0.0.1", port), Request)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="lambda-front", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def hosts(self) -> set[str]:
        port = self.server.server_address[1]
        return {f"127.0.0.1:{port}", f"localhost:{port}"}

    def start(self) -> LambdaFront:
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        while not self.pending.empty():  # nobody will run these any more
            _, _, done = self.pending.get_nowait()
            done.set_exception(RuntimeError("the local stack stopped"))

    def serve(self) -> int:
        """Run the invocations that came in since the last call (on the caller's thread); how many."""
        n = 0
        while True:
            try:
                handler, event, done = self.pending.get_nowait()
            except queue.Empty:
                return n
            n += 1
            try:
                done.set_result(handler(event))
            except Exception as exc:  # the handler failed: Lambda answers a function error
                done.set_exception(exc)

    # ------------------------------------------------------------------------------------ requests
    def answer(self, req: BaseHTTPRequestHandler) -> None:
        # Only what an AWS SDK or CLI sends: a signed request (a web page cannot send an Authorization
        # header to another origin without a preflight, which is refused here) to this very address (no
        # other name pointing at 127.0.0.1). Without it, any page open in a browser could submit a job
        # whose command the local stack would run on this machine. Checked on the headers, before a byte
        # of the body is read: a refused request is never read whole.
        host = req.headers.get("Host", "")
        if not req.headers.get("Authorization", "").startswith("AWS4-HMAC-SHA256 ") or host not in self.hosts:
            self._refuse(req, 403, "the local stack answers signed AWS requests only")
            return
        m = INVOKE.match(urlsplit(req.path).path)
        name = unquote(m.group("name")).rsplit(":function:", 1)[-1].split(":", 1)[0] if m else None
        invoke = req.command == "POST" and name in self.handlers
        length = _length(req.headers.get("Content-Length"), req.headers.get("Transfer-Encoding"))
        if isinstance(length, str):
            self._refuse(req, 411 if "Transfer-Encoding" in length else 400, length)
            return
        bound = MAX_INVOKE_BODY if invoke else MAX_BODY
        if length > bound:
            self._refuse(req, 413, f"the body is {length} bytes; the local stack takes at most {bound}")
            return
        body = req.rfile.read(length)
        if len(body) < length:  # the client went before it sent what it said
            req.close_connection = True
            return
        if invoke and name is not None:
            self._invoke(req, self.handlers[name], body)
            return
        self._pass(req, body)

    def _refuse(self, req: BaseHTTPRequestHandler, status: int, message: str) -> None:
        """Answer `status` without reading the body, and close the connection (what is left of the body
        must not be read as the next request)."""
        req.close_connection = True
        self._reply(req, status, {"message": message}, {"Connection": "close"})

    def _invoke(self, req: BaseHTTPRequestHandler, handler: Handler, body: bytes) -> None:
        try:
            event = json.loads(body or b"{}")
        except ValueError:
            self._reply(
                req,
                400,
                {"message": "the payload is not JSON"},
                {"x-amzn-ErrorType": "InvalidRequestContentException"},
            )
            return
        done: Future[Any] = Future()
        self.pending.put((handler, event, done))
        try:
            result = done.result(timeout=INVOKE_TIMEOUT_SECONDS)
        except TimeoutError:
            self._reply(
                req,
                200,
                {"errorMessage": "the local stack did not answer in time", "errorType": "Timeout"},
                {"X-Amz-Function-Error": "Unhandled"},
            )
            return
        except Exception as exc:  # what Lambda answers when the handler raises
            error = {"errorMessage": str(exc), "errorType": type(exc).__name__}
            self._reply(req, 200, error, {"X-Amz-Function-Error": "Unhandled"})
            return
        self._reply(req, 200, result, {"X-Amz-Executed-Version": "$LATEST"})

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, status: int, payload: Any, headers: dict[str, str]) -> None:
        data = json.dumps(payload).encode()
        req.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def _pass(self, req: BaseHTTPRequestHandler, body: bytes) -> None:
        """moto server answers every other request."""
        conn = http.client.HTTPConnection(self.moto.hostname or "127.0.0.1", self.moto.port, timeout=60)
        try:
            headers = {k: v for k, v in req.headers.items() if k.lower() not in _NOT_PASSED}
            headers["Host"] = self.moto.netloc
            conn.request(req.command, req.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        req.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in _NOT_PASSED:
                req.send_header(k, v)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(data)


def _length(value: str | None, transfer_encoding: str | None) -> int | str:
    """The request's Content-Length, or why it is refused (a string): not a whole number, negative, or a
    chunked body (every AWS SDK sends a length)."""
    if transfer_encoding:
        return "Transfer-Encoding is not taken here: send a Content-Length"
    if value is None or value.strip() == "":
        return 0
    text = value.strip()
    if not text.isdigit() or len(text) > 15:
        return f"Content-Length must be a whole number of bytes, not {value[:40]!r}"
    return int(text)


class _QuietServer(ThreadingHTTPServer):
    """A dropped client (it hung up, or was silent for SOCKET_TIMEOUT_SECONDS) is no news: no traceback.
    Anything else is said in one line."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            return
        print(f"local stack front: {type(error).__name__}: {error}".splitlines()[0], file=sys.stderr)
