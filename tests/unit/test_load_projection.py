"""bench/local_load.py --latency --isolated: the latency model notes each call's round trip to the service
apart from its modelled wait, and the projection takes that time out of each warning's and each
invocation's, so that every call counts for its modelled latency alone."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from spotguard.adapters import clients
from spotguard_cli.emulator.latency import Latency, LatencyModel, Served
from spotguard_cli.emulator.scaling import Invocation, Scaling
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))  # local_load imports its neighbour cold_start
_spec = importlib.util.spec_from_file_location("bench_local_load", REPO / "bench" / "local_load.py")
local_load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(local_load)

A, B = "i-0000000000000000a", "i-0000000000000000b"
SERVICE_SECONDS = 0.12


class _SlowDynamoDB(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(SERVICE_SECONDS)
        body = json.dumps({"TableNames": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def slow_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowDynamoDB)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.server_address[1]}")
    clients.reset()
    try:
        yield server.server_address[0]
    finally:
        clients.reset()
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_model_notes_each_calls_time_at_the_service_apart_from_its_modelled_wait(
    slow_service: str,
) -> None:
    model = LatencyModel(by_service={"dynamodb": Latency(300, 301)}).install()

    def name_it(context: dict[str, Any], **_: Any) -> None:
        context["who"] = "me"

    clients.on_every_call(name_it)
    began = time.monotonic()
    clients.client("dynamodb", "us-east-1").list_tables()
    model.enabled = False
    clients.client("dynamodb", "us-east-1").list_tables()  # not modelled, not noted

    assert len(model.served) == 1
    served = model.served[0]
    assert served.context["who"] == "me"  # the call's own context, as its other hooks saw it
    assert SERVICE_SECONDS <= served.seconds < SERVICE_SECONDS + 0.25  # without the 0.3 s wait before it
    assert served.ended - began >= 0.3 + SERVICE_SECONDS
    assert served.waited == pytest.approx(0.3, rel=0.01) and served.began >= began
    assert model.slept_seconds == pytest.approx(0.3, rel=0.01)


def _bodies(*instances: str) -> tuple[str, ...]:
    return tuple(json.dumps({"detail": {"instance-id": i}}) for i in instances)


def test_without_notes_of_moto_the_projection_is_the_invocation_as_timed_and_placed() -> None:
    inv = Invocation(_bodies(A, B), started=100.0, ended=101.0)
    put = {A: 0.0, B: 0.0}
    arrive = {A: 0.05, B: 0.1}
    times, durations = local_load.project([inv], put, arrive, {A: 100.4, B: 100.9}, Scaling(), 0.5)
    assert durations == [1.0]
    # placed when its last record arrived (0.1 s), in a cold environment (0.5 s)
    assert times == {A: pytest.approx(0.1 + 0.5 + 0.4), B: pytest.approx(0.1 + 0.5 + 0.9)}


def _call(began: float, sent: float, ended: float) -> Served:
    return Served(ended=ended, seconds=ended - sent, waited=sent - began, context={})


def test_moto_time_before_a_warnings_last_stop_is_taken_out_of_it_and_of_its_invocation() -> None:
    inv = Invocation(_bodies(A, B), started=100.0, ended=101.0)
    # A, one call after another: 0.2 s and 0.1 s in moto before its StopTask at 100.4, 0.3 s after it
    # B: one call, 0.5 s in moto, before its StopTask at 100.9
    in_moto = {
        A: [_call(100.0, 100.0, 100.2), _call(100.2, 100.25, 100.35), _call(100.45, 100.5, 100.8)],
        B: [_call(100.0, 100.1, 100.6)],
    }
    last_stop = {A: 100.4, B: 100.9}
    times, durations = local_load.project(
        [inv], {A: 0.0, B: 0.0}, {A: 0.0, B: 0.0}, last_stop, Scaling(), 0.0, in_moto
    )
    assert times == {A: pytest.approx(0.4 - 0.3), B: pytest.approx(0.9 - 0.5)}
    # the records ran side by side: A's calls ended at 0.8 s less 0.6 s in moto, B's at 0.6 less 0.5; then
    # 0.2 s after the last call to the invocation's end
    assert durations == [pytest.approx(0.2 + 0.2)]


def test_side_by_side_calls_count_for_the_longest_modelled_latency_of_the_group() -> None:
    # the stop's modelled wait (0.3 s) runs while the drain is in moto; moto answers the stop after it
    stop, drain = _call(0.0, 0.3, 0.9), _call(0.0, 0.05, 0.6)
    assert local_load.moto_bound([stop, drain], 0.9) == pytest.approx(0.6)  # 0.3 to 0.9: moto alone
    # two calls sent at once, moto answering one after the other: both waits are over, all of it is moto's
    first, second = _call(0.0, 0.06, 0.5), _call(0.0, 0.06, 0.9)
    assert local_load.moto_bound([first, second], 0.9) == pytest.approx(0.84)
    # nothing of the group is taken out before the time asked for, and nothing outside its calls
    assert local_load.moto_bound([first, second], 0.3) == pytest.approx(0.24)
    assert local_load.moto_bound([_call(1.0, 1.0, 1.2)], 5.0) == pytest.approx(0.2)


def test_a_shorter_invocation_frees_its_environment_sooner_for_the_next_batch() -> None:
    first = Invocation(_bodies(A), started=0.0, ended=2.0)
    second = Invocation(_bodies(B), started=2.0, ended=2.5)
    one = Scaling(initial=1, per_minute=1, limit=1)  # one environment: the second waits for the first
    put = arrive = {A: 0.0, B: 0.0}
    last_stop = {A: 1.0, B: 2.4}
    waited, _ = local_load.project([first, second], put, arrive, last_stop, one, 0.0)
    assert waited[B] == pytest.approx(2.0 + 0.4)
    faster, _ = local_load.project(
        [first, second], put, arrive, last_stop, one, 0.0, {A: [_call(0.4, 0.4, 1.9)]}
    )
    assert faster[B] == pytest.approx(0.5 + 0.4)
