"""`spotguard jobs` against `spotguard local up`, as a user runs them: the one line `up` prints (the
endpoint, region and credentials), then submit a job spec, list, status (with its picture), logs and
cancel, each answering as it would on AWS."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a moto server, the local stack and a training process


def _wait(what, timeout: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(every)
    return False


def test_jobs_submit_list_status_logs_cancel_against_local_up(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    up = subprocess.Popen(
        [sys.executable, "-m", "spotguard_cli.main", "local", "up", "--instances", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(x.decode() for x in up.stdout or []), daemon=True)
    reader.start()
    state_file = tmp_path / ".local-stack" / "up.json"
    try:
        assert _wait(state_file.exists, 120), "".join(lines)
        # the line `up` prints, as a user pastes it
        exports = next(
            x for x in "".join(lines).splitlines() if x.strip().startswith("export AWS_ENDPOINT_URL")
        )
        cli_env = dict(env)
        for pair in exports.strip().removeprefix("export ").split():
            k, _, v = pair.partition("=")
            cli_env[k] = v
        state = json.loads(state_file.read_text())
        assert cli_env["AWS_ENDPOINT_URL"] == state["front"]

        script = tmp_path / "my_train.py"  # a user's own script, not the project's
        script.write_text(
            "import time\n"
            "for step in range(10_000):\n"
            "    print(f'my step {step}', flush=True)\n"
            "    time.sleep(0.05)\n"
        )
        spec = tmp_path / "job.yaml"
        spec.write_text(
            f"name: mine\ncluster: gpu-spot\nimage: mine:local\ncommand: {sys.executable} {script}\ngpus: 1\n"
        )

        def cli(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "spotguard_cli.main", "jobs", *argv],
                cwd=tmp_path,
                env=cli_env,
                capture_output=True,
                text=True,
                timeout=120,
            )

        submitted = cli("submit", str(spec))
        assert submitted.returncode == 0, submitted.stderr
        assert "job mine" in submitted.stdout
        listed = cli("list")
        assert listed.returncode == 0 and "mine" in listed.stdout, listed.stderr

        def running() -> bool:
            answer = json.loads(cli("--json", "status", "mine").stdout)
            return answer["job"]["state"] == "running" and bool(
                answer["job"]["attempts"][0].get("started_at")
            )

        assert _wait(running, 60, every=1.0)
        picture = tmp_path / "mine.png"
        status = cli("status", "mine", "--plot", str(picture))
        assert status.returncode == 0 and "running" in status.stdout and picture.stat().st_size > 0

        def logged() -> bool:
            out = cli("logs", "mine").stdout
            return "my step 3" in out

        assert _wait(logged, 60, every=1.0), cli("logs", "mine").stderr
        cancelled = cli("cancel", "mine")
        assert cancelled.returncode == 0, cancelled.stderr
        assert _wait(
            lambda: json.loads(cli("--json", "status", "mine").stdout)["job"]["state"] == "cancelled", 60, 1.0
        )
        missing = cli("status", "nope")
        assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "nope" in missing.stderr
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        reader.join(timeout=10)
    assert up.returncode == 0, "".join(lines)
