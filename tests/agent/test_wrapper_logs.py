"""What `spotguard-agent run` prints: its commits and restores by what they count (the wrapper's commits,
not the job's steps, which it does not know), and no line of boto's at every start."""

from __future__ import annotations

import json
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
    # and its manifests say what their step counts (issue 45, item 15: read as training steps)
    manifests = [json.loads(m.read_text()) for m in volume.rglob("MANIFEST.json")]
    assert manifests and all(m["counts"] == "commits" for m in manifests)


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
    (manifest,) = (tmp_path / "v").rglob("MANIFEST.json")
    assert json.loads(manifest.read_text())["counts"] == "steps"


# saves every 0.1 s (a new file renamed into place, as torch.save to a temporary name does) for 4 s,
# then exits 0; DIR is never still for --quiet-seconds 0.3
OFTEN = (
    "import os, sys, time\n"
    "d = sys.argv[1]\n"
    "for step in range(80):\n"
    "    with open(os.path.join(d, 'tmp'), 'w') as f: f.write(str(step))\n"
    "    os.replace(os.path.join(d, 'tmp'), os.path.join(d, 'state.txt'))\n"
    "    time.sleep(0.1)\n"
)


@pytest.mark.slow  # the command runs 8 s: five windows of 1.5 s for a copy, of which two must be taken
@pytest.mark.alone  # its windows are the wall clock's: another worker's load closes them
def test_a_command_that_saves_more_often_than_the_quiet_time_gets_its_saves_committed(
    tmp_path: Path, volume: Path
):
    """Issue 45, item 13: a script saving every 2 s (the wrapper's quiet time) got nothing committed in
    640 steps, and nothing said. Now a consistent copy is committed while it runs, and the wrapper says so."""
    directory = tmp_path / "d"
    directory.mkdir()
    argv = ["run", "--dir", str(directory), "--poll-seconds", "0.05", "--quiet-seconds", "0.3"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spotguard_agent.wrapper",
            *argv,
            "--",
            sys.executable,
            "-c",
            OFTEN,
            str(directory),
        ],
        env=_env(volume),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    commits = proc.stderr.count("committed checkpoint ")
    assert commits >= 2, proc.stderr  # while it ran (not only at its exit)
    assert proc.stderr.count("committing a consistent copy of it as the command goes on") == 1, proc.stderr
    (newest,) = [m for m in sorted(volume.rglob("state.txt"))][-1:]
    assert newest.read_text().isdigit()  # never a torn file


@pytest.mark.parametrize(
    ("script", "term_first", "exits"),
    [
        ("pass", False, 0),  # finished before SIGTERM came: done, never run again (issue 45, item 14)
        ("raise SystemExit(3)", False, 75),  # failed, and SpotGuard stopped it: resumed
        # a script that saves and exits 0 on SIGTERM has stopped, not finished
        (
            "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\ntime.sleep(30)",
            True,
            75,
        ),
        ("import time\ntime.sleep(30)", True, 75),  # killed by it
    ],
)
def test_exit_0_wins_only_when_the_command_finished_before_sigterm_reached_it(
    tmp_path: Path, script: str, term_first: bool, exits: int
):
    """Issue 45, item 14: SIGTERM that reached the wrapper as its command exited 0 made it exit 75, and the
    finished job ran again."""
    import signal
    import time

    from spotguard_agent.wrapper import Wrapper

    wrapper = Wrapper(agent=None, directory=tmp_path, command=[])  # type: ignore[arg-type]
    wrapper.child = subprocess.Popen([sys.executable, "-c", script])
    if term_first:
        time.sleep(0.5)  # the command runs (and has set its handler)
    else:
        wrapper.child.wait()
    wrapper._forward(signal.SIGTERM, None)
    code = wrapper.child.wait(timeout=30)
    assert wrapper._exit_code(code, has_checkpoint=True) == exits


def test_the_library_outside_spotguard_says_how_to_run_the_script_alone(tmp_path: Path):
    """Issue 45, item 20: `python my_train.py` using the agent's library outside SpotGuard was a traceback."""
    script = "from spotguard_agent import Agent\nAgent.from_env()\nprint('made')\n"
    env = {k: v for k, v in agent_env(tmp_path).items() if k != "SPOTGUARD_CHECKPOINT_URI"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, (
        done.stderr
    )
    assert "SPOTGUARD_CHECKPOINT_URI=file:///tmp/my-checkpoints/ python SCRIPT" in done.stderr
