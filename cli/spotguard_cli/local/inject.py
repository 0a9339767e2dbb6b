"""`spotguard local inject`: a notice of any kind for an instance, put on the bus of a running
`spotguard local up`; or a capacity shortage in one of its pools, which it carries out."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from spotguard_cli.arguments import number
from spotguard_cli.emulator.inject import KINDS
from spotguard_cli.local.shared import SHORTAGE, SHORTAGES, STATE_FILE


def add_parser(actions: Any) -> None:
    i = actions.add_parser("inject", help="send a notice into a running `spotguard local up`")
    i.add_argument(
        "kind",
        choices=sorted(
            [k for k in KINDS if k not in ("checkpoint-manifest", "task-state-change", "ebs-snapshot")]
            + [SHORTAGE]
        ),
    )
    i.add_argument("--instance", help="the EC2 instance id (see `spotguard local up`)")
    i.add_argument("--pool", help=f"{SHORTAGE}: the pool's capacity provider (see `spotguard local up`)")
    i.add_argument(
        "--for",
        dest="seconds",
        type=number(0, 100_000, low_open=True, unit="seconds"),
        default=300.0,
        help=f"{SHORTAGE}: seconds until the pool can launch again (default 300)",
    )
    i.set_defaults(run=run_inject)


def run_inject(args: argparse.Namespace) -> int:
    import boto3

    from spotguard_cli.emulator.inject import make_event, put_entry
    from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS

    if not STATE_FILE.exists():
        print(
            "spotguard local inject: no local stack is up (start one with `spotguard local up`)",
            file=sys.stderr,
        )
        return 2
    state = json.loads(STATE_FILE.read_text())
    if args.kind == SHORTAGE:
        providers = state.get("capacity_providers") or []
        if args.pool not in providers:
            print(
                f"spotguard local inject: --pool must be one of the local pools ({', '.join(providers)})",
                file=sys.stderr,
            )
            return 2
        SHORTAGES.mkdir(parents=True, exist_ok=True)
        ask = {"pool": args.pool, "seconds": args.seconds}
        (SHORTAGES / f"{time.time_ns()}.json").write_text(json.dumps(ask))
        print(f"{args.pool}: no capacity for {args.seconds:g} s (the running stack takes it within a second)")
        return 0
    if not args.instance:
        print(f"spotguard local inject: {args.kind} needs --instance", file=sys.stderr)
        return 2
    if args.instance not in state["instances"]:
        print(
            f"spotguard local inject: {args.instance} is not one of the local instances "
            f"({', '.join(state['instances'])})",
            file=sys.stderr,
        )
        return 2
    events = boto3.client(
        "events",
        endpoint_url=state["endpoint"],
        region_name=state["region"],
        aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=FAKE_CREDENTIALS["AWS_SESSION_TOKEN"],
    )
    event = make_event(args.kind, args.instance, region=state["region"])
    resp = events.put_events(Entries=[put_entry(event)])
    if resp.get("FailedEntryCount"):
        print(f"spotguard local inject: refused: {resp['Entries']}", file=sys.stderr)
        return 1
    print(f"{args.kind} for {args.instance} put on the bus (event {event['id']})")
    return 0
