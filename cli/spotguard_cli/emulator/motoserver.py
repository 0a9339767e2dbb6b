"""Start and stop moto server on a free port of 127.0.0.1, by its process id."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from types import TracebackType

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """`with MotoServer() as m:` -> m.endpoint is http://127.0.0.1:<port>; the process is gone after."""

    def __init__(self, port: int | None = None, log_path: str | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> MotoServer:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, **FAKE_CREDENTIALS}
        self.proc = subprocess.Popen(
            # moto server with atomic conditional writes in DynamoDB (motopatch.py)
            [
                sys.executable,
                "-m",
                "spotguard_cli.emulator.motopatch",
                "-H",
                "127.0.0.1",
                "-p",
                str(self.port),
            ],
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,  # its own process group: stopped as a whole, never orphaned
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server did not answer on {self.endpoint} within {timeout:.0f}s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)

    def reset(self) -> None:
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def hold_ecs_tasks(endpoint: str) -> None:
    """moto moves an ECS task one state on at every DescribeTasks; a real task stays RUNNING until it
    is stopped. Manual progression that never advances makes moto behave like ECS here."""
    body = json.dumps({"model_name": "ecs::task", "transition": {"progression": "manual", "times": 10**9}})
    req = urllib.request.Request(
        f"{endpoint}/moto-api/state-manager/set-transition", data=body.encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10):
        pass
