"""examples/README.md's "Run train.py locally against moto server" works as written: it starts moto
server, gives boto a region and credentials besides the endpoint, and makes the bucket before training
(without them the agent exits 69 with NoCredentialsError, or NoSuchBucket)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _block() -> str:
    text = (REPO / "examples" / "README.md").read_text()
    start = text.index("Run `train.py` locally against moto server")
    return text[start:].split("```sh\n", 1)[1].split("```", 1)[0]


def test_the_local_run_starts_moto_and_sets_everything_boto_needs_before_training():
    block = _block()
    order = [
        "moto_server -p 5000",
        "AWS_ENDPOINT_URL=http://127.0.0.1:5000",
        "AWS_DEFAULT_REGION=",
        "AWS_ACCESS_KEY_ID=",
        "AWS_SECRET_ACCESS_KEY=",
        "create_bucket(Bucket='bucket')",
        "SPOTGUARD_CHECKPOINT_URI=s3://bucket/",
        "examples/train.py",
    ]
    where = [block.find(x) for x in order]
    assert -1 not in where and where == sorted(where), dict(zip(order, where, strict=True))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow  # starts moto server and trains (about 10 s)
def test_the_local_run_works_as_written(tmp_path: Path):
    """The block run in a shell, from a directory that looks like the repository's root (its .venv and
    examples linked), on a free port and with fewer steps; moto server ends with the shell."""
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    (tmp_path / "examples").symlink_to(REPO / "examples")
    block = _block().replace("5000", str(_free_port())).replace("--steps 200", "--steps 20")
    # whatever happens, the shell's background jobs (moto server) end with it
    script = f"set -e\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n{block}\necho trained\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SPOTGUARD_"))}
    proc = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "finished" in proc.stdout and (tmp_path / "final.pt").stat().st_size > 0
