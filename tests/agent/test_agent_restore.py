"""What the agent (the library in a training script, and the `spotguard-agent run` wrapper) does when
restore cannot go on: another job's manifest is passed over; a committed checkpoint that cannot be read
now, a refused SPOTGUARD_RESUME_FROM or a refused restore target end the process with one line on stderr
and a non-zero exit (never a traceback, never a fresh start)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spotguard_agent import Agent, AgentEnv, CheckpointStore
from spotguard_agent.wrapper import main

from tests.agent.test_store import read, write
from tests.conftest import REPO


def _agent(store: CheckpointStore, **env: str) -> Agent:
    environ = {"SPOTGUARD_CHECKPOINT_URI": "s3://unused/x/", "SPOTGUARD_WATCH_METADATA": "false", **env}
    return Agent(AgentEnv.load(environ), store, install_signals=False)


def _our_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("spotguard-agent: ")]


@pytest.mark.slow  # the moto server
def test_another_jobs_manifest_is_skipped_with_a_warning_and_never_deleted(s3, bucket, tmp_path, caplog):
    uri = f"s3://{bucket}/jobs/shared/"
    setup = CheckpointStore(s3, uri, keep=5)
    setup.commit(write(tmp_path / "a", {"w": b"mine"}), step=1, progress=0.1, job_id="j-1")
    setup.commit(write(tmp_path / "b", {"w": b"theirs"}), step=9, progress=0.9, job_id="j-2")
    store = CheckpointStore(s3, uri, keep=1)
    agent = _agent(store, SPOTGUARD_JOB_ID="j-1", SPOTGUARD_CHECKPOINT_URI=uri)
    with caplog.at_level(logging.WARNING, logger="spotguard.agent"):
        m = agent.restore(tmp_path / "r")
    assert m is not None and m.sequence == 0 and read(tmp_path / "r") == {"w": b"mine"}
    assert any("j-2" in r.getMessage() and "j-1" in r.getMessage() for r in caplog.records)
    agent.commit(write(tmp_path / "c", {"w": b"mine, later"}), step=2, progress=0.2)
    agent.commit(write(tmp_path / "d", {"w": b"mine, later still"}), step=3, progress=0.3)
    assert store.committed() == [1, 3]  # keep=1 deletes my older ones, never the other job's


@pytest.mark.slow  # the moto server
def test_without_a_job_id_on_either_side_any_manifest_is_restored(s3, bucket, tmp_path):
    uri = f"s3://{bucket}/jobs/shared/"
    store = CheckpointStore(s3, uri)
    store.commit(write(tmp_path / "a", {"w": b"mine"}), step=1, progress=0.1, job_id="j-1")
    store.commit(write(tmp_path / "b", {"w": b"anyone's"}), step=2, progress=0.2, job_id="")
    assert _agent(store, SPOTGUARD_JOB_ID="j-1").restore(tmp_path / "r").sequence == 1  # no job_id in it
    store.commit(write(tmp_path / "c", {"w": b"theirs"}), step=3, progress=0.3, job_id="j-2")
    assert _agent(store).restore(tmp_path / "r2").sequence == 2  # no SPOTGUARD_JOB_ID set


@pytest.mark.slow  # the moto server
def test_the_agent_exits_in_one_line_when_the_newest_checkpoint_cannot_be_read_now(
    faults, bucket, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("spotguard_agent.store.RETRY_PAUSE_SECONDS", 0.0, raising=False)
    uri = f"s3://{bucket}/jobs/j-1/"
    store = CheckpointStore(faults.client, uri)
    store.commit(write(tmp_path / "a", {"w": b"good"}), step=1, progress=0.1)
    faults.add("GetObject", "slowdown")
    agent = _agent(store, SPOTGUARD_CHECKPOINT_URI=uri)
    agent.store.retry_pause = 0.0
    with pytest.raises(SystemExit) as exited:
        agent.restore(tmp_path / "r")
    assert exited.value.code == 69
    (line,) = _our_lines(capsys.readouterr().err)
    assert "checkpoint 0" in line and "cannot be read now" in line and "SlowDown" in line


@pytest.mark.slow  # the moto server
def test_the_wrapper_exits_69_and_runs_nothing_when_the_checkpoint_cannot_be_read_now(
    faults, bucket, tmp_path, capsys, monkeypatch
):
    uri = f"s3://{bucket}/jobs/j-1/"
    CheckpointStore(faults.client, uri).commit(write(tmp_path / "a", {"w": b"good"}), step=1, progress=0.1)
    faults.add("HeadObject", "internal")
    faults.add("GetObject", "internal")
    monkeypatch.setattr("spotguard_agent.store.RETRY_PAUSE_SECONDS", 0.0, raising=False)
    monkeypatch.setattr("spotguard_agent.agent.boto3.client", lambda *a, **k: faults.client)
    monkeypatch.setenv("SPOTGUARD_CHECKPOINT_URI", uri)
    monkeypatch.setenv("SPOTGUARD_WATCH_METADATA", "false")
    ran = tmp_path / "ran"
    code = main(["run", "--dir", str(tmp_path / "d"), "--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"])
    assert code == 69 and not ran.exists()
    (line,) = _our_lines(capsys.readouterr().err)
    assert "cannot be read now" in line


# ------------------------------------------------------------------- in processes of their own
def _env(volume: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SPOTGUARD_"))}
    return {
        **env,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
        "SPOTGUARD_WATCH_METADATA": "false",
        "SPOTGUARD_JOB_ID": "j-1",
        "SPOTGUARD_CHECKPOINT_URI": f"file://{volume}/",
        **extra,
    }


def _wrapper(directory: Path, ran: Path) -> list[str]:
    command = [sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    return [sys.executable, "-m", "spotguard_agent.wrapper", "run", "--dir", str(directory), "--", *command]


def _count(out: Path) -> list[str]:
    return [sys.executable, str(REPO / "examples" / "count.py"), "--steps", "3", "--out", str(out)]


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    volume = tmp_path / "volume"
    CheckpointStore(None, f"file://{volume}/").commit(
        write(tmp_path / "a", {"state.json": b'{"next": 1, "ran": {}}'}), step=0, progress=0.3, job_id="j-1"
    )
    return volume


@pytest.mark.parametrize("program", ["wrapper", "library"])
@pytest.mark.parametrize(
    "resume_from",
    [
        "file://{tmp}/elsewhere/checkpoints/0000000000/MANIFEST.json",
        "file://{tmp}/volume/checkpoints/0000000000/../../../elsewhere/checkpoints/0000000000/MANIFEST.json",
        "file://{tmp}/volume/checkpoints/0/MANIFEST.json",
        "s3://bucket/volume/checkpoints/0000000000/MANIFEST.json",
    ],
)
def test_a_refused_resume_from_ends_the_process_in_one_line(volume, tmp_path, program, resume_from):
    ran = tmp_path / "ran"
    cmd = _wrapper(tmp_path / "d", ran) if program == "wrapper" else _count(ran)
    env = _env(volume, SPOTGUARD_RESUME_FROM=resume_from.format(tmp=tmp_path))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("spotguard-agent: ") and "is not a manifest under" in line
    assert not ran.exists()


@pytest.mark.parametrize("program", ["wrapper", "library"])
def test_a_restore_target_that_is_a_symlink_is_refused(volume, tmp_path, program):
    elsewhere = write(tmp_path / "elsewhere", {"precious": b"not a checkpoint"})
    ran = tmp_path / "ran"
    if program == "wrapper":
        target = tmp_path / "d"
        target.symlink_to(elsewhere, target_is_directory=True)
        proc = subprocess.run(
            _wrapper(target, ran), env=_env(volume), capture_output=True, text=True, timeout=60
        )
    else:
        script = (
            "import sys; from spotguard_agent import Agent; "
            f"Agent.from_env().restore({str(tmp_path / 'd')!r}); open({str(ran)!r}, 'w')"
        )
        (tmp_path / "d").symlink_to(elsewhere, target_is_directory=True)
        proc = subprocess.run(
            [sys.executable, "-c", script], env=_env(volume), capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "symbolic link" in line and "Traceback" not in proc.stderr
    assert not ran.exists() and read(elsewhere) == {"precious": b"not a checkpoint"}
