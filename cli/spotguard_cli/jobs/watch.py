"""`spotguard jobs status --watch`: the status again every --interval seconds until the job ends."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from spotguard_cli.answers import AnswerError, read_answer
from spotguard_cli.clock import Clock
from spotguard_cli.jobs.render import TERMINAL_STATES, plot, render

MAX_WATCH_FAILURES = 5  # --watch: the function failing this many times in a row ends it (exit 1)


def watch(
    args: argparse.Namespace, fetch: Callable[[], dict[str, Any]], out: TextIO, clock: Clock, tty: bool
) -> int:
    """The status again every interval until the job ends: the screen redrawn on a terminal, else each
    new state printed once (what the job spent, which grows while it runs, is no new state)."""
    last: str | None = None
    failures = 0
    try:
        while True:
            try:
                answer = fetch()
            except Exception as exc:  # tried again, up to MAX_WATCH_FAILURES in a row
                failures += 1
                why = f"{type(exc).__name__}: {exc}".splitlines()[0]
                print(f"spotguard jobs status: ({failures}/{MAX_WATCH_FAILURES}) {why}", file=sys.stderr)
                if failures >= MAX_WATCH_FAILURES:
                    return 1
                clock.sleep(args._interval)
                continue
            failures = 0
            try:
                read = read_answer(answer)
                job = read.status()
            except AnswerError as exc:  # the function refused (its error), or an answer not read
                print(f"spotguard jobs status: {exc}", file=sys.stderr)
                return 1
            state = job.model_dump_json(exclude={"spend"})
            ended = job.state in TERMINAL_STATES
            now = clock.now()
            if tty:
                text = json.dumps(answer, indent=2, sort_keys=True) if args.json else render(read)
                footer = (
                    "the job has ended"
                    if ended
                    else f"every {args._interval:g} s until the job ends; Ctrl-C to stop"
                )
                out.write("\x1b[H\x1b[2J")
                print(f"{text}\n\n{now:%Y-%m-%d %H:%M:%S} UTC - {footer}", file=out, flush=True)
            elif state != last:
                if args.json:
                    print(json.dumps(answer, sort_keys=True), file=out, flush=True)
                else:
                    print(f"--- {now:%Y-%m-%d %H:%M:%S} UTC\n{render(read)}", file=out, flush=True)
            if args.plot and state != last and not plot(args.plot, read, clock):
                return 1
            last = state
            if ended:
                return 0
            clock.sleep(args._interval)
    except KeyboardInterrupt:
        print("spotguard jobs status: stopped watching (the job goes on)", file=sys.stderr)
        return 130
