"""A real (small, CPU) PyTorch training with the agent, interrupted as SpotGuard interrupts it, resumed
as SpotGuard resumes it: no step lost, and the final weights bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid

import boto3
import pytest

torch = pytest.importorskip("torch")

from spotguard_agent import CheckpointStore  # noqa: E402

from ..conftest import REPO  # noqa: E402

TRAIN = REPO / "examples" / "train.py"
STEPS = 60


def _env(moto_server, uri: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SPOTGUARD_"))}
    env.update(
        AWS_ENDPOINT_URL=moto_server.endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",  # never look for 169.254.169.254 from a test
        SPOTGUARD_JOB_ID="j-test",
        SPOTGUARD_CHECKPOINT_URI=uri,
        **extra,
    )
    return env


def _run(env, out, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TRAIN), "--steps", str(STEPS), "--out", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _start(env, out, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(TRAIN),
            "--steps",
            str(STEPS),
            "--out",
            str(out),
            "--step-seconds",
            "0.05",
            *args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_until(proc, pattern: str) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if re.fullmatch(pattern, line.strip()):
            return lines
    raise AssertionError(
        f"the job ended before printing {pattern!r}: {lines[-5:]} {proc.stderr.read()[-2000:]}"
    )


def _steps(lines: list[str]) -> list[int]:
    return [int(m[1]) for m in (re.match(r"step (\d+) ", x) for x in lines) if m]


def _same_weights(a, b) -> bool:
    wa, wb = torch.load(a), torch.load(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def reference(moto_server, tmp_path_factory):
    """The same training, never interrupted. Run once for the module: the training is deterministic (the
    tests say so: bit-identical weights), and the tests only compare their final weights with its."""
    s3 = boto3.client("s3", endpoint_url=moto_server.endpoint, region_name="us-east-1")
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    out = tmp_path_factory.mktemp("reference") / "reference.pt"
    proc = _run(_env(moto_server, f"s3://{bucket}/reference/"), out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_sigterm_checkpoints_exits_75_and_resumes_with_nothing_lost(
    moto_server, s3, bucket, reference, tmp_path, mode
):
    uri = f"s3://{bucket}/jobs/{uuid.uuid4().hex[:8]}/"
    extra = ["--sync"] if mode == "sync" else []
    proc = _start(_env(moto_server, uri), tmp_path / "never.pt", *extra)
    before = _read_until(proc, r"step 20 loss .*")
    proc.send_signal(signal.SIGTERM)  # what StopTask does
    rest, err = proc.communicate(timeout=120)
    lines = before + rest.splitlines()
    assert proc.returncode == 75, err[-2000:]
    last_done = _steps(lines)[-1]
    assert f"checkpointed after step {last_done}: exit 75" in lines

    store = CheckpointStore(s3, uri)
    manifest_uri = store.newest()
    assert store.read_manifest(store.committed()[-1]).step == last_done  # 0 steps lost

    out = tmp_path / "resumed.pt"
    resumed = _run(_env(moto_server, uri, SPOTGUARD_RESUME_FROM=manifest_uri, SPOTGUARD_ATTEMPT="1"), out)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed after step {last_done}" in resumed.stdout
    assert _steps(resumed.stdout.splitlines())[0] == last_done + 1
    assert _same_weights(out, reference)


@pytest.mark.slow
def test_sigusr1_checkpoints_and_training_goes_on(moto_server, s3, bucket, reference, tmp_path):
    uri = f"s3://{bucket}/jobs/{uuid.uuid4().hex[:8]}/"
    proc = _start(_env(moto_server, uri), tmp_path / "never.pt")
    _read_until(proc, r"step 15 loss .*")
    proc.send_signal(signal.SIGUSR1)  # what SpotGuard sends over SSM on a rebalance recommendation
    lines = _read_until(proc, r"step 40 loss .*")
    proc.kill()  # then the instance vanishes with no warning at all
    proc.communicate(timeout=60)
    assert 40 in _steps(lines)  # it went on training after the checkpoint

    store = CheckpointStore(s3, uri)
    (sequence,) = store.committed()
    step = store.read_manifest(sequence).step
    assert 15 <= step < 40

    out = tmp_path / "resumed.pt"
    resumed = _run(_env(moto_server, uri, SPOTGUARD_RESUME_FROM=store.newest(), SPOTGUARD_ATTEMPT="1"), out)
    assert resumed.returncode == 0 and f"resumed after step {step}" in resumed.stdout
    assert _same_weights(out, reference)


PLAIN = REPO / "examples" / "train_plain.py"


@pytest.mark.slow
def test_the_wrapper_makes_an_unmodified_script_survive(moto_server, s3, bucket, reference, tmp_path):
    uri = f"s3://{bucket}/jobs/{uuid.uuid4().hex[:8]}/"
    ckpt = tmp_path / "first-host" / "ckpt"

    def wrapped(ckpt_dir, out, **extra):
        return [
            sys.executable,
            "-m",
            "spotguard_agent.wrapper",
            "run",
            "--dir",
            str(ckpt_dir),
            "--poll-seconds",
            "0.2",
            "--quiet-seconds",
            "0.4",
            "--",
            sys.executable,
            str(PLAIN),
            "--steps",
            str(STEPS),
            "--ckpt-dir",
            str(ckpt_dir),
            "--save-every",
            "10",
            "--out",
            str(out),
            "--step-seconds",
            "0.1",
        ]

    proc = subprocess.Popen(
        wrapped(ckpt, tmp_path / "never.pt"),
        env=_env(moto_server, uri),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    store = CheckpointStore(s3, uri)
    before = _read_until(proc, r"step 12 loss .*")  # the script has saved its own checkpoint at step 9
    deadline = time.monotonic() + 30
    while not store.committed() and time.monotonic() < deadline:  # the wrapper commits it while it runs
        time.sleep(0.1)
    assert store.committed(), "the wrapper did not commit the script's checkpoint while it ran"
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)  # to the wrapper, which forwards it to the script
    rest, err = proc.communicate(timeout=120)
    lines = before + rest.splitlines()
    assert proc.returncode == 75, err[-2000:]
    saved = int(re.search(r"saved after step (\d+), stopping", rest)[1])
    assert saved == _steps(lines)[-1]  # the script's own last step is in the checkpoint
    assert len(store.committed()) >= 2  # the one committed while it ran, then the last

    # A new task on another host: an empty directory, restored by the wrapper before the script starts.
    out = tmp_path / "resumed.pt"
    other = tmp_path / "second-host" / "ckpt"
    resumed = subprocess.run(
        wrapped(other, out),
        env=_env(moto_server, uri, SPOTGUARD_RESUME_FROM=store.newest(), SPOTGUARD_ATTEMPT="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed after step {saved}" in resumed.stdout
    assert _same_weights(out, reference)


@pytest.mark.slow  # the moto server, the agent as a process
def test_the_wrapper_passes_the_command_exit_code_through(moto_server, bucket, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "spotguard_agent.wrapper",
        "run",
        "--dir",
        str(tmp_path / "d"),
        "--",
        sys.executable,
        "-c",
        "import sys; sys.exit(3)",
    ]
    proc = subprocess.run(cmd, env=_env(moto_server, f"s3://{bucket}/x/"), capture_output=True, timeout=120)
    assert proc.returncode == 3


@pytest.mark.slow  # the moto server, the agent as a process
def test_the_wrapper_explains_bad_use(moto_server, bucket, tmp_path):
    base = [sys.executable, "-m", "spotguard_agent.wrapper"]
    env = _env(moto_server, f"s3://{bucket}/x/")
    no_cmd = subprocess.run([*base, "run", "--dir", str(tmp_path)], env=env, capture_output=True, text=True)
    assert no_cmd.returncode == 2 and "give the command after --" in no_cmd.stderr
    bad_uri = subprocess.run(
        [*base, "run", "--dir", str(tmp_path), "--", "true"],
        env=_env(moto_server, "s3://bucket/no-slash"),
        capture_output=True,
        text=True,
    )
    assert bad_uri.returncode == 2 and "s3://bucket/prefix/" in bad_uri.stderr
    assert "Traceback" not in no_cmd.stderr + bad_uri.stderr
