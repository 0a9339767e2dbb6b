"""The deployed jobs function, found and invoked: its name from the stack's outputs (samconfig.toml's
stack_name, or --stack) unless --function names it; boto3 clients for the logs, made once each."""

from __future__ import annotations

import argparse
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotguard_cli.jobs.log_streams import ClientFactory

Invoke = Callable[[dict[str, Any]], dict[str, Any]]
SAMCONFIG = Path("samconfig.toml")


def stack_name(explicit: str | None, samconfig: Path = SAMCONFIG) -> str:
    if explicit:
        return explicit
    if samconfig.exists():
        conf = tomllib.loads(samconfig.read_text())
        name = conf.get("default", {}).get("global", {}).get("parameters", {}).get("stack_name")
        if name:
            return str(name)
    return "spotguard"


def lambda_invoker(args: argparse.Namespace) -> Invoke:
    import boto3

    session = boto3.session.Session(region_name=args.region)
    kwargs = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    function = args.function
    if not function:
        cfn = session.client("cloudformation", **kwargs)
        name = stack_name(args.stack)
        (stack,) = cfn.describe_stacks(StackName=name)["Stacks"]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        if "JobsFunctionName" not in outputs:
            raise LookupError(f"stack {name} has no JobsFunctionName output: is it a SpotGuard stack?")
        function = outputs["JobsFunctionName"]
    lam = session.client("lambda", **kwargs)

    def invoke(body: dict[str, Any]) -> dict[str, Any]:
        resp = lam.invoke(FunctionName=function, Payload=json.dumps(body).encode())
        raw = resp["Payload"].read()
        if resp.get("FunctionError"):
            detail = json.loads(raw or b"{}").get("errorMessage", "")
            return {
                "ok": False,
                "error": {"type": "FunctionError", "message": f"the function failed: {detail}"},
            }
        return dict(json.loads(raw))

    return invoke


def aws_clients(args: argparse.Namespace) -> ClientFactory:
    """boto3 clients by service and region (the region an ARN or a log configuration names, else the
    session's), made once each, all at --endpoint-url when it is given."""
    import boto3

    session = boto3.session.Session(region_name=args.region)
    kwargs = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    made: dict[tuple[str, str | None], Any] = {}

    def client(service: str, region: str | None = None) -> Any:
        key = (service, region)
        if key not in made:
            made[key] = session.client(service, region_name=region, **kwargs)
        return made[key]

    return client
