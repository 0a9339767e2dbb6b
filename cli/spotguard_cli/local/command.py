"""The `spotguard local` command: one action per module of this package, in the order help lists them.
Building the parser loads neither the simulator nor numpy: each action imports what it runs when it
runs."""

from __future__ import annotations

from typing import Any

from spotguard_cli.local import demo, inject, run, soak, up
from spotguard_cli.local.replay import command as replay


def add_parser(sub: Any) -> None:
    p = sub.add_parser("local", help="run the whole system on this machine (moto server on 127.0.0.1)")
    actions = p.add_subparsers(dest="local_action", required=True, metavar="ACTION")
    demo.add_parser(actions)
    run.add_parser(actions)
    up.add_parser(actions)
    inject.add_parser(actions)
    replay.add_parser(actions)
    soak.add_parser(actions)
