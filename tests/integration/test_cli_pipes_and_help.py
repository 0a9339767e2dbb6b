"""What a new user trips over at the command line (issue 45, items 20 and 21): a closed pipe is no
traceback, and every flag a command requires says what it is."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spotguard_cli.main import build_parser

# `spotguard explain` with its run made to print far more than a pipe holds, read by `head -1`
BIG = (
    "import sys, spotguard_cli.explain as e, spotguard_cli.main as m\n"
    "def run(args):\n"
    "    for _ in range(20000): print('x' * 100)\n"
    "    return 0\n"
    "e.run = run\n"
    "sys.exit(m.main(['explain', sys.argv[1]]))\n"
)


def test_a_reader_that_goes_is_not_a_traceback(tmp_path):
    sample = "events/eventbridge/spot-interruption-warning.json"
    done = subprocess.run(
        f'{sys.executable} -c "$BIG" {sample} | head -1',
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        env={"BIG": BIG, "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )
    assert done.stdout == "x" * 100 + "\n"
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def _help(*argv: str) -> str:
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args([*argv, "--help"])
    return ""


@pytest.mark.parametrize("command", [["simulate"], ["jobs", "cancel"], ["local", "up"]])
def test_every_option_of_these_commands_says_what_it_is(command, capsys):
    _help(*command)
    out = capsys.readouterr().out
    options = out.split("options:", 1)[1]
    lines = [line for line in options.splitlines() if line.startswith("  -")]
    bare = [line.strip() for line in lines if len(line.split("  ")) < 3 and not line.rstrip().endswith(",")]
    # a flag's line has its help beside it, or on the next line: one without either says nothing
    said = options.splitlines()
    missing = [
        said[i].strip()
        for i, line in enumerate(said)
        if line.startswith("  -")
        and line.strip() in bare
        and (i + 1 >= len(said) or not said[i + 1].startswith("     "))
    ]
    assert missing == [], f"{' '.join(command)}: options without help: {missing}"


def test_a_stop_spotguard_asked_for_is_not_called_user_initiated():
    """ECS gives every StopTask the stop code UserInitiated, SpotGuard's for a spot warning too."""
    from spotguard_cli.answers import AttemptView
    from spotguard_cli.jobs.log_lines import why_stopped

    warned = AttemptView(
        number=1,
        last_status="STOPPED",
        stop_code="UserInitiated",
        stopped_reason="SpotGuard: spot-interruption e1 on i-1",
        interrupted_by="spot-interruption#e1#i-1",
        outcome="resubmit",
        outcome_reason="checkpointed (exit 75)",
        exit_codes={"train": 75},
    )
    assert "UserInitiated" not in why_stopped(warned)
    by_hand = AttemptView(number=1, last_status="STOPPED", stop_code="UserInitiated", stopped_reason="by me")
    assert "UserInitiated" in why_stopped(by_hand)


def test_interrupt_at_takes_the_same_words_in_local_demo_and_local_run():
    """Issue 45, item 21: a step in `local demo`, seconds in `local run`, for one flag. Both take step:N."""
    from spotguard_cli.local.run import _interrupt

    parser = build_parser()
    assert parser.parse_args(["local", "demo", "--interrupt-at", "step:7"]).interrupt_at == 7
    assert parser.parse_args(["local", "demo", "--interrupt-at", "7"]).interrupt_at == 7
    assert _interrupt("step:7") == ("step", 7.0) and _interrupt("20") == ("seconds", 20.0)
