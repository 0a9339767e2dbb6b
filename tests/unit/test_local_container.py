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
