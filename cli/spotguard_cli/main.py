"""`spotguard`: the operator's command line.

spotguard explain EVENT_FILE...   what SpotGuard would do with each event (no AWS needed)
spotguard jobs ACTION ...         submit, resubmit, cancel, status, list (calls the deployed stack)
spotguard local demo|up|inject    the whole system on this machine, tasks as local processes
spotguard simulate ...            capacity policies on spot availability traces (cost, deadline misses)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from spotguard_cli import explain, jobs, simulate
from spotguard_cli.arguments import one_line_errors_everywhere
from spotguard_cli.local import command as local


def version() -> str:
    """SpotGuard's one version: the VERSION file of the checkout this runs from (an editable install's
    metadata keeps the version it was installed with), else the installed package's."""
    checkout = Path(__file__).resolve().parents[2] / "VERSION"
    if checkout.is_file():
        return checkout.read_text().strip()
    from importlib.metadata import version as installed  # only when asked: the CLI starts fast

    return installed("spotguard")


class _Version(argparse.Action):
    """--version, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **_: object) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="print SpotGuard's version and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"{parser.prog} {version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotguard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    explain.add_parser(sub)
    jobs.add_parser(sub)
    local.add_parser(sub)
    simulate.add_parser(sub)
    one_line_errors_everywhere(parser)  # a bad argument anywhere: one line naming it, exit status 2
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread as Ctrl-C is: every `with` and `finally` on the way out
    runs, so the processes a command started (moto server, the tasks, the demos' trainings) are stopped
    by their ids rather than left running, reparented to init."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminated(signum: int, _frame: object) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the clean-up is under way: a second one waits for it
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    before: dict[signal.Signals, object] = {}
    with contextlib.suppress(ValueError):  # only the main thread may (a test calling main in another)
        before = {sig: signal.signal(sig, _terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return int(args.run(args))
    except Terminated as ended:
        print(f"terminated ({ended}): what it started is stopped", file=sys.stderr)
        return 128 + ended.signum
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went (`spotguard jobs logs JOB | head`): nothing more to say
        with contextlib.suppress(OSError):  # and no second error when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell's own commands end
    finally:
        for sig, handler in before.items():  # as they were (a caller in this process keeps its own)
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
