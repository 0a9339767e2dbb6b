"""What `spotguard-agent run` prints: its commits and restores by what they count (the wrapper's commits,
not the job's steps, which it does not know), and no line of boto's at every start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.test_agent_restore import _env as agent_env

WRITE = "import pathlib, sys; pathlib.Path(sys.argv[1], 'state.txt').write_text('42')"


def _env(volume: Path) -> dict[str, str]:
    # credentials in the environment: boto says 'Found credentials in environment variables.' at INFO
    return agent_env(volume, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")


def _run(directory: Path, volume: Path) -> str:
    command = [sys.executable, "-c", WRITE, str(directory)]
    argv = ["run", "--dir", str(directory), "--poll-seconds", "0.05", "--quiet-seconds", "0", "--", *command]
    proc = subprocess.run(
        [sys.executable, "-m", "spotguard_agent.wrapper", *argv],
        env=_env(volume),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    return tmp_path / "volume"


def test_the_wrapper_logs_its_commits_not_steps_and_no_boto_chatter(tmp_path: Path, volume: Path):
    first = _run(tmp_path / "a", volume)
    assert "spotguard-agent: committed checkpoint 0 (wrapper commit 1, " in first, first
    assert "step" not in first and "Found credentials" not in first, first
    again = _run(tmp_path / "b", volume)  # a new attempt: restored from the first one's commit
    assert "spotguard-agent: restored checkpoint 0 (wrapper commit 1)" in again, again
    assert "step" not in again and "Found credentials" not in again, again


def test_the_library_still_says_step(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    from spotguard_agent import Agent, AgentEnv, CheckpointStore

    env = AgentEnv.load({"SPOTGUARD_CHECKPOINT_URI": f"file://{tmp_path / 'v'}/"})
    agent = Agent(env, CheckpointStore(None, env.checkpoint_uri), install_signals=False)
    state = tmp_path / "s"
    state.mkdir()
    (state / "x").write_text("1")
    with caplog.at_level("INFO", logger="spotguard.agent"):
        agent.commit(state, step=40, progress=0.5)
    assert any(r.getMessage().startswith("committed checkpoint 0 (step 40, ") for r in caplog.records)
