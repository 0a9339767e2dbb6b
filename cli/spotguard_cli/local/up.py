"""`spotguard local up`: the stack with the pools of examples/gpu-cluster, kept running until Ctrl-C;
prints the endpoint and names, and carries out the capacity shortages `spotguard local inject` asks for."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from spotguard_cli.arguments import number, whole
from spotguard_cli.local.shared import SHORTAGE, SHORTAGES, STATE_DIR, STATE_FILE


def add_parser(actions: Any) -> None:
    u = actions.add_parser("up", help="keep the local stack running until Ctrl-C")
    u.add_argument(
        "--instances",
        type=whole(1, 50),
        default=2,
        help="simulated GPU spot instances (default 2); one on-demand instance is started beside them",
    )
    u.add_argument(
        "--reconcile-every",
        type=number(0, 3600, low_open=True, unit="seconds"),
        help="seconds between reconcile runs (default: the template's schedule)",
    )
    u.set_defaults(run=run_up)


def run_up(args: argparse.Namespace) -> int:
    from spotguard_cli.emulator.assembly import CLUSTER
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem

    STATE_DIR.mkdir(exist_ok=True)
    stop = {"now": False}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["now"] = True

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # each stops what it started, by id
        signal.signal(sig, on_signal)
    with MotoServer(log_path=str(STATE_DIR / "moto.log")) as moto:
        printer = _Printer()
        system = LocalSystem(
            moto.endpoint, STATE_DIR / "up", on_change=printer.add, reconcile_every=args.reconcile_every
        )
        from spotguard_cli.emulator.front import LambdaFront
        from spotguard_cli.emulator.logship import LogShipper
        from spotguard_cli.emulator.timeline import record_calls

        record_calls(printer, [])  # SpotGuard's own calls, as they happen
        # the one endpoint for the CLI and the SDKs: Invoke answered here, the rest passed to moto
        front = LambdaFront(moto.endpoint, _handlers(system)).start()
        # the tasks' output into CloudWatch Logs, as the awslogs driver does: `spotguard jobs logs`
        shipper = LogShipper(system.runner, system.stack.client("logs"))
        try:
            # the pools of examples/gpu-cluster: spot in two zones and on-demand (one instance)
            system.add_pools()
            spot = ["gpu-spot-a", "gpu-spot-b"]
            hosts = [system.add_pool_host(spot[i % 2]) for i in range(args.instances)]
            hosts.append(system.add_pool_host("gpu-od"))
            system.pump()
            SHORTAGES.mkdir(parents=True, exist_ok=True)
            for old in SHORTAGES.glob("*.json"):
                old.unlink()
            state = {
                "endpoint": moto.endpoint,
                "front": front.endpoint,
                "region": system.stack.region,
                "moto_pid": moto.proc.pid if moto.proc else None,
                "cluster": system.cluster.name,
                "instances": [h.instance_id for h in hosts],
                "pools": {h.instance_id: h.capacity_provider for h in hosts},
                "capacity_providers": sorted(system.pools),
                "outputs": system.stack.outputs,
            }
            STATE_FILE.write_text(json.dumps(state, indent=2))
            print(
                f"SpotGuard runs locally at {front.endpoint} "
                f"(moto server {moto.endpoint}, {system.stack.region})"
            )
            print(f"  cluster {system.cluster.name}, instances (pool):")
            for h in hosts:
                print(f"    {h.instance_id} ({h.capacity_provider}, {h.availability_zone})")
            for k in ("JobsFunctionName", "LedgerTableName", "CheckpointBucketName", "NotificationsTopicArn"):
                print(f"  {k}: {system.stack.outputs.get(k)}")
            print(f"  state: {STATE_FILE}; logs: {STATE_DIR / 'up'}/")
            print(try_lines(state, CLUSTER))
            print("Ctrl-C stops everything.")
            while not stop["now"]:
                _take_shortages(system)
                front.serve()
                system.pump()
                front.serve()
                try:
                    shipper.ship()
                except Exception as exc:  # a log line moto refused must not end the local stack
                    printer.add(f"logs not shipped this round: {type(exc).__name__}: {exc}".splitlines()[0])
                time.sleep(0.1)
        finally:
            front.close()
            system.close()
            STATE_FILE.unlink(missing_ok=True)
    print("stopped: moto server and every task process.")
    return 0


def try_lines(state: dict[str, Any], cluster: str) -> str:
    """What to try against a running `local up`, as commands that work pasted into another shell: the
    AWS CLI and boto3 need the endpoint, a region and credentials (moto's), or they stop at
    NoRegionError or NoCredentialsError."""
    from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS

    env = {
        "AWS_ENDPOINT_URL": state.get("front") or state["endpoint"],
        "AWS_DEFAULT_REGION": state["region"],
        "AWS_ACCESS_KEY_ID": FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }
    return "\n".join(
        [
            "  try, in another shell (the local stack's endpoint, region and credentials):",
            "       export " + " ".join(f"{k}={v}" for k, v in env.items()),
            f"       aws ecs list-tasks --cluster {cluster}",
            "       spotguard jobs submit examples/jobs/train-local.yaml && spotguard jobs list",
            f"       spotguard local inject spot-interruption --instance {state['instances'][0]}",
            f"       spotguard local inject {SHORTAGE} --pool gpu-spot-a --for 600",
        ]
    )


def _handlers(system: Any) -> dict[str, Any]:
    """The stack's functions by name (as CloudFormation named them, and by logical id), for the front."""
    out: dict[str, Any] = {}
    for logical, host in system.functions.items():
        out[host.fn.name] = out[logical] = host.invoke
    return out


def _take_shortages(system: Any) -> None:
    """Carry out the capacity shortages `spotguard local inject capacity-shortage` asked for."""
    for path in sorted(SHORTAGES.glob("*.json")):
        try:
            ask = json.loads(path.read_text())
            system.capacity_shortage(str(ask["pool"]), float(ask["seconds"]))
            system.on_change(f"{ask['pool']}: no capacity for {float(ask['seconds']):g} s (injected)")
        except (OSError, ValueError, KeyError) as exc:
            system.on_change(f"capacity shortage {path.name} not carried out: {exc}")
        path.unlink(missing_ok=True)


class _Printer:
    """A timeline that prints each line as it comes (for `spotguard local up`)."""

    def add(self, what: str) -> None:
        # the terminal itself: while a handler runs, stdout is its log (EMF metrics go there)
        print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.__stdout__, flush=True)
