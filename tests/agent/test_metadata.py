"""The agent's instance-metadata watcher against a local IMDSv2 stand-in on 127.0.0.1, and the
Young/Daly checkpoint interval."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from spotguard_agent import Agent, AgentEnv, CheckpointStore
from spotguard_agent.imds import MetadataWatcher


class Imds:
    """IMDSv2: PUT a token first; GETs without a valid token get 401; 404 until something is set."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}
        self.tokens = {"t-1"}
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_PUT(self):
                ok = self.path == "/latest/api/token" and self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                )
                self.send_response(200 if ok else 400)
                self.end_headers()
                if ok:
                    self.wfile.write(b"t-1")

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") not in imds.tokens:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = imds.paths.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                if body is not None:
                    self.wfile.write(body.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        # shutdown() waits for the serving loop's next look at its flag: every 50 ms, not the default 0.5 s
        serve = {"poll_interval": 0.05}
        threading.Thread(target=self.server.serve_forever, kwargs=serve, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def imds():
    server = Imds()
    yield server
    server.close()


def _wait(pred, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_a_spot_instance_action_stops_and_a_rebalance_checkpoints_once(imds):
    stops, saves = [], []
    w = MetadataWatcher(stops.append, saves.append, endpoint=imds.endpoint, poll_seconds=0.05).start()
    try:
        assert _wait(lambda: w.reachable is True)
        time.sleep(0.2)
        assert stops == [] and saves == []
        imds.paths["/latest/meta-data/events/recommendations/rebalance"] = json.dumps(
            {"noticeTime": "2026-11-21T14:40:12Z"}
        )
        assert _wait(lambda: len(saves) == 1)
        time.sleep(0.2)
        assert len(saves) == 1  # the same recommendation is acted on once
        imds.paths["/latest/meta-data/spot/instance-action"] = json.dumps(
            {"action": "terminate", "time": "2026-11-21T14:48:03Z"}
        )
        assert _wait(lambda: len(stops) == 1)
        assert "terminate" in stops[0]
    finally:
        w.close()


def test_an_expired_token_is_renewed(imds):
    stops = []
    w = MetadataWatcher(stops.append, lambda _: None, endpoint=imds.endpoint, poll_seconds=0.05).start()
    try:
        assert _wait(lambda: w.reachable is True)
        imds.tokens = {"t-1"}  # the server still accepts it; now expire it and issue the same again on PUT
        w._token = "expired"
        imds.paths["/latest/meta-data/spot/instance-action"] = json.dumps({"action": "stop"})
        assert _wait(lambda: len(stops) == 1)
    finally:
        w.close()


def test_off_ec2_the_watcher_gives_up_quietly():
    w = MetadataWatcher(lambda _: None, lambda _: None, endpoint="http://127.0.0.1:9", timeout=0.2).start()
    assert _wait(lambda: w.reachable is False)
    w.close()


def _agent(s3, bucket, **env):
    e = AgentEnv.model_validate({"SPOTGUARD_CHECKPOINT_URI": f"s3://{bucket}/j/", **env})
    return Agent(e, CheckpointStore(s3, e.checkpoint_uri), install_signals=False)


@pytest.mark.slow  # the moto server
def test_young_daly_interval(s3, bucket):
    plain = _agent(s3, bucket, SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS="1800")
    plain.note_cost(10)
    assert plain.interval() == 1800  # no interruption rate: the configured interval
    adaptive = _agent(
        s3, bucket, SPOTGUARD_INTERRUPTIONS_PER_HOUR="0.5", SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS="3600"
    )
    assert adaptive.interval() == 3600  # no cost measured yet
    adaptive.note_cost(20)  # M = 7200 s between interruptions: sqrt(2 * 20 * 7200) = 536.7 s
    assert adaptive.interval() == pytest.approx(math.sqrt(2 * 20 * 7200))
    adaptive.note_cost(0.001)
    assert adaptive.interval() == 60  # never more often than once a minute
    adaptive.note_cost(10_000)
    assert adaptive.interval() == 3600  # never less often than configured


def test_bad_agent_environment_is_one_line():
    from spotguard_agent import StoreError

    with pytest.raises(StoreError, match="SPOTGUARD_CHECKPOINT_URI"):
        AgentEnv.load({})
    with pytest.raises(StoreError, match="SPOTGUARD_ATTEMPT"):
        AgentEnv.load({"SPOTGUARD_CHECKPOINT_URI": "s3://b/p/", "SPOTGUARD_ATTEMPT": "-1"})
