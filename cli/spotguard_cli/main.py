"""`spotguard`: the operator's command line.

spotguard explain EVENT_FILE...   what SpotGuard would do with each event (no AWS needed)
spotguard jobs ACTION ...         submit, resubmit, cancel, status, list (calls the deployed stack)
spotguard local demo|up|inject    the whole system on this machine, tasks as local processes
spotguard simulate ...            capacity policies on spot availability traces (cost, deadline misses)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spotguard_cli import explain, jobs, localcmd, simulate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotguard", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    explain.add_parser(sub)
    jobs.add_parser(sub)
    localcmd.add_parser(sub)
    simulate.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
