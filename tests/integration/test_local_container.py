"""The local stack's container for `spotguard local run` (spotguard_cli.local.container): the checkpoint
directory in the command line becomes the attempt's own, taken literally and never the root."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from spotguard_cli.local.container import container_command

ROOT = Path("/tmp/run/containers/job-attempt-1")


def test_the_checkpoint_directory_in_the_command_becomes_the_attempts_own():
    out = container_command(["python", "train.py", "--dir", "/ck", "--out=/ck/x", "/ckpt"], ROOT, "/ck/")
    assert out == [sys.executable, "train.py", "--dir", f"{ROOT}/ck", f"--out={ROOT}/ck/x", "/ckpt"]


@pytest.mark.parametrize("directory", ["/ck\\1", "/ck\\n", "/ck\\g<0>"])
def test_the_directory_is_substituted_literally(directory: str):
    """Issue 45, item 5: the path was a regular expression's replacement (`/ck\\1` crashed the wrapper
    with re.error, a literal `\\n` became a newline)."""
    out = container_command(["python", "t.py", directory], ROOT, directory)
    assert out == [sys.executable, "t.py", str(ROOT) + directory]


@pytest.mark.parametrize("directory", ["//", "/.", "/./", "/"])
def test_the_root_is_never_the_checkpoint_directory(directory: str):
    """`//` rewrote every argument of the command, the interpreter's path included."""
    with pytest.raises(ValueError, match="the container's root"):
        container_command(["python", "t.py"], ROOT, directory)


def test_where_no_private_view_can_be_had_a_command_that_does_not_name_the_directory_is_refused():
    """Issue 45, item 16: only the command line was rewritten, so a script that hard-codes the directory
    wrote to the machine's own, shared by every attempt and rehearsal."""
    wrapped = ["spotguard-agent", "run", "--dir", "/opt/ckpt", "--", "python", "train.py"]
    with pytest.raises(ValueError, match=r"checkpoint_dir /opt/ckpt: the command does not name it"):
        container_command(wrapped, ROOT, "/opt/ckpt")  # the wrapper's --dir is not the script naming it
    named = [*wrapped, "--out", "/opt/ckpt/state.pt"]
    assert container_command(named, ROOT, "/opt/ckpt")[-1] == f"{ROOT}/opt/ckpt/state.pt"
    # with a private view (a mount namespace), nothing is rewritten: the path is the attempt's own there
    assert container_command(wrapped, ROOT, "/opt/ckpt", isolated=True)[-2:] == ["python", "train.py"]


@pytest.mark.skipif(sys.platform != "linux" or __import__("os").geteuid() != 0, reason="needs root on Linux")
def test_as_root_each_attempt_sees_its_own_directory_at_the_path_the_script_hard_codes(tmp_path):
    import os
    import subprocess
    import uuid

    hard_coded = f"/tmp/spotguard-test-{uuid.uuid4().hex}/ckpt"  # never this machine's /opt
    script = f"open({hard_coded!r} + '/state.txt', 'w').write('mine')"  # named in no argument
    env = {**os.environ, "SPOTGUARD_JOB_ID": "j1", "SPOTGUARD_ATTEMPT": "1"}
    argv = [
        sys.executable,
        "-m",
        "spotguard_cli.local.container",
        "--root",
        str(tmp_path),
        "--dir",
        hard_coded,
    ]
    done = subprocess.run(
        [*argv, "--", "python", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "j1-attempt-1" / hard_coded.lstrip("/") / "state.txt").read_text() == "mine"
    assert not os.path.exists(f"{hard_coded}/state.txt")  # the machine's own directory got nothing
    os.rmdir(hard_coded)  # the bind's empty mount point
    os.rmdir(os.path.dirname(hard_coded))
