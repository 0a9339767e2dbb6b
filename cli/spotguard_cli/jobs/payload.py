"""`spotguard jobs`' flags turned into the jobs function's payload, and the flags of status and logs
checked, before anything is invoked: a refusal is a CommandError, said in one line with exit status 2."""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from spotguard.domain.jobs.commands import CommandError
from spotguard.domain.jobs.submission import JobOptions
from spotguard_cli.arguments import PICTURE_SUFFIXES
from spotguard_cli.jobs.spec import JobSpec, load_spec

DEFAULT_INTERVAL = 5.0


def option_bounds(name: str) -> tuple[int, int]:
    """A whole-number job option's bounds as the jobs function's model has them, so a flag is refused
    in one line by argparse exactly where the function would refuse it."""
    metadata = JobOptions.model_fields[name].metadata
    low = next(int(m.ge) for m in metadata if hasattr(m, "ge"))
    high = next(int(m.le) for m in metadata if hasattr(m, "le"))
    return low, high


NODE_COUNTS = option_bounds("nodes")
RENDEZVOUS_PORTS = option_bounds("rendezvous_port")


def payload(args: argparse.Namespace) -> dict[str, Any]:
    if args.action == "submit":
        out: dict[str, Any] = {"action": "submit", "request": _request(args)}
        options = {
            k: v
            for k, v in {
                "max_attempts": args.max_attempts,
                "max_error_retries": args.max_error_retries,
                "deadline": args.deadline,
                "avoid_pool_seconds": args.avoid_pool_seconds,
                "checkpoint_container": args.checkpoint_container,
                "work_hours": args.work_hours,
                "capacity": args.capacity,
                "nodes": args.nodes,
                "rendezvous_port": args.rendezvous_port,
            }.items()
            if v is not None
        }
        if args.rendezvous_port is not None and (args.nodes or 1) < 2:
            raise CommandError(
                "BadRequest", "--rendezvous-port: for a multi-node job (give --nodes 2 or more)"
            )
        if options:
            out["options"] = options
        if args.job_id:
            out["job_id"] = args.job_id
        return out
    if args.action == "resubmit":
        key = "task_arn" if args.target.startswith("arn:") else "job_id"
        out = {"action": "resubmit", key: args.target}
        if args.checkpoint:
            out["checkpoint"] = args.checkpoint
        return out
    if args.action == "cancel":
        return {"action": "cancel", "job_id": args.job_id, "reason": args.reason}
    if args.action in ("status", "logs"):
        _polling(args)
        return {"action": "status", "job_id": args.job_id}
    out = {"action": "list", "limit": args.limit}
    if args.state:
        out["state"] = args.state
    return out


SPEC_FLAGS = ("image", "command", "gpus", "checkpoint_dir", "env")


def job_spec(args: argparse.Namespace) -> JobSpec | None:
    """The submit's job spec: the file given, with the flags over its fields; or one from the flags alone
    when --image (or another spec-only flag) is given. None: a RunTask request (--request, or
    --cluster and --task-definition)."""
    if args.action != "submit":
        return None
    spec_only = [f for f in SPEC_FLAGS if getattr(args, f, None) is not None]
    if not args.spec and not spec_only:
        return None
    if args.request:
        raise CommandError("BadRequest", "give a job spec or --request (a RunTask request), not both")
    for flag in ("launch_type", "checkpoint_container"):
        if getattr(args, flag, None) is not None:
            raise CommandError(
                "BadRequest",
                f"--{flag.replace('_', '-')}: not for a job spec (it runs on EC2, container train)",
            )
    environment = None
    if args.env:
        environment = {}
        for pair in args.env:
            name, sep, value = pair.partition("=")
            if not sep:
                raise CommandError("BadRequest", f"--env: NAME=VALUE, not {pair!r}")
            environment[name] = value
    overrides = {
        "name": args.job_id,
        "cluster": args.cluster,
        "task_definition": args.task_definition,
        "image": args.image,
        "command": args.command,
        "gpus": args.gpus,
        "checkpoint_dir": args.checkpoint_dir,
        "environment": environment,
        "capacity_provider": args.capacity_provider,
        "subnets": _ids(args.subnets) if args.subnets else None,
        "security_groups": _ids(args.security_groups) if args.security_groups else None,
        "deadline": args.deadline,
        "capacity": args.capacity,
        "work_hours": args.work_hours,
        "max_attempts": args.max_attempts,
        "max_error_retries": args.max_error_retries,
        "avoid_pool_seconds": args.avoid_pool_seconds,
        "nodes": args.nodes,
        "rendezvous_port": args.rendezvous_port,
    }
    return load_spec(args.spec or "", overrides)


def _request(args: argparse.Namespace) -> dict[str, Any]:
    if args.request:
        if args.cluster or args.task_definition or args.subnets or args.security_groups:
            raise CommandError(
                "BadRequest", "give --request, or --cluster, --task-definition and the rest, not both"
            )
        text = args.request
        if text == "-":
            text = sys.stdin.read()
        elif not text.lstrip().startswith("{"):
            try:
                text = Path(text).read_text()
            except OSError as exc:
                raise CommandError(
                    "BadRequest", f"--request: cannot read {text}: {exc.strerror or exc}"
                ) from None
        try:
            request = json.loads(text)
        except ValueError as exc:
            raise CommandError("BadRequest", f"--request: not valid JSON: {exc}") from None
        if not isinstance(request, dict):
            raise CommandError("BadRequest", "--request: must be a JSON object")
        if "action" in request and "request" in request:
            raise CommandError(
                "BadRequest",
                "--request: this is a whole jobs-function payload (it has 'action'); give its 'request' "
                "alone, a RunTask request like events/jobs/requests/runtask.json",
            )
        return request
    if not (args.cluster and args.task_definition):
        raise CommandError("BadRequest", "give --request FILE, or --cluster and --task-definition")
    request = {"cluster": args.cluster, "taskDefinition": args.task_definition}
    if args.capacity_provider:
        request["capacityProviderStrategy"] = [{"capacityProvider": args.capacity_provider}]
    if args.launch_type:
        request["launchType"] = args.launch_type
    if args.subnets or args.security_groups:
        if not args.subnets:
            raise CommandError("BadRequest", "--security-groups needs --subnets (awsvpc tasks need both)")
        vpc: dict[str, Any] = {"subnets": _ids(args.subnets), "assignPublicIp": "DISABLED"}
        if args.security_groups:
            vpc["securityGroups"] = _ids(args.security_groups)
        request["networkConfiguration"] = {"awsvpcConfiguration": vpc}
    return request


def as_flags(message: str) -> str:
    """The function's refusal, with the fields that came from flags named by the flags too:
    `options.x_y` is `--x-y (options.x_y)`, the list's `limit` is --limit."""
    message = re.sub(
        r"\boptions\.([a-z_]+)", lambda m: f"--{m.group(1).replace('_', '-')} ({m.group(0)})", message
    )
    return re.sub(r"(?:^|(?<=; )|(?<=, ))limit(?=[:,])", "--limit", message)


def _ids(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


_DURATION = re.compile(r"^([0-9]{1,5})([smhd])$")
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _polling(args: argparse.Namespace) -> None:
    """Checks status's and logs' own flags; the values are kept on `args` as `_interval`, `_since`
    (a datetime, or a timedelta back from now) and `_attempt`."""
    polls = getattr(args, "watch", False) or getattr(args, "follow", False)
    args._interval = DEFAULT_INTERVAL
    if getattr(args, "interval", None) is not None:
        flag = "--watch" if args.action == "status" else "--follow"
        if not polls:
            raise CommandError("BadRequest", f"--interval is for {flag}")
        try:
            args._interval = float(args.interval)
        except ValueError:
            raise CommandError(
                "BadRequest", f"--interval: not a number of seconds: {args.interval}"
            ) from None
        if not 1 <= args._interval <= 3600:
            raise CommandError("BadRequest", "--interval: between 1 and 3600 seconds")
    if getattr(args, "plot", None):
        path = Path(args.plot)
        if path.suffix.lower() not in PICTURE_SUFFIXES:
            raise CommandError("BadRequest", f"--plot: the file's name ends in {', '.join(PICTURE_SUFFIXES)}")
        if not path.parent.is_dir():
            raise CommandError("BadRequest", f"--plot: no such directory: {path.parent}")
    args._since = None
    if getattr(args, "since", None):
        args._since = _since(args.since)
    args._attempt = None
    if getattr(args, "attempt", None) is not None:
        if not re.fullmatch(r"[0-9]{1,4}", args.attempt) or int(args.attempt) < 1:
            raise CommandError(
                "BadRequest", f"--attempt: an attempt's number (1, 2, ...), not {args.attempt}"
            )
        if args.follow:
            raise CommandError(
                "BadRequest", "--attempt and --follow: follow the whole job, or read one attempt"
            )
        args._attempt = int(args.attempt)


def _since(text: str) -> datetime | timedelta:
    m = _DURATION.match(text.strip())
    if m:
        return timedelta(**{_UNIT[m.group(2)]: int(m.group(1))})
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CommandError(
            "BadRequest", f"--since: a duration (90s, 10m, 2h, 1d) or an ISO 8601 time, not {text}"
        ) from None
    if at.tzinfo is None:
        raise CommandError("BadRequest", f"--since: {text} has no time zone (add Z or +00:00)")
    return at
