"""`spotguard jobs submit|resubmit|cancel|status|list|logs`: the deployed jobs function, from a shell.

The function is found from the stack (samconfig.toml's stack_name, or --stack) or named with
--function; the payload is validated with the same pydantic models the function uses before anything is
invoked. Answers print as readable tables, or as the function's JSON with --json. Exit status: 0 ok,
1 the function refused (its one-line error is printed), 2 bad arguments.

`status --watch` asks again every --interval seconds until the job ends (redrawing the screen on a
terminal, printing each new state once otherwise); `status --plot FILE` draws the job's timeline
(`spotguard_cli.timeline_plot`); `logs` prints the job's container logs over all its attempts, from
CloudWatch Logs (`spotguard_cli.jobs.logs`), and `logs --follow` keeps reading until the job ends.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from spotguard.domain.commands import CommandError, parse_command
from spotguard.domain.jobs.model import JobState
from spotguard_cli.arguments import number, whole
from spotguard_cli.clock import Clock, SystemClock
from spotguard_cli.jobs.logs import ClientFactory, LogsOptions, run_logs

Invoke = Callable[[dict[str, Any]], dict[str, Any]]
SAMCONFIG = Path("samconfig.toml")
DEFAULT_INTERVAL = 5.0
MAX_WATCH_FAILURES = 5  # --watch: the function failing this many times in a row ends it (exit 1)
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
TERMINAL_STATES = {s.value for s in JobState if s.terminal}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("jobs", help="submit, resubmit, cancel and inspect jobs (calls the deployed stack)")
    p.add_argument("--stack", help="the stack's name (default: samconfig.toml's stack_name, else spotguard)")
    p.add_argument("--function", help="the jobs function's name (default: found from the stack)")
    p.add_argument("--region", help="AWS region (default: your AWS configuration)")
    p.add_argument("--endpoint-url", help="an AWS endpoint to use instead (the local stack's moto server)")
    p.add_argument("--json", action="store_true", help="print the function's answer as JSON")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    s = actions.add_parser("submit", help="start a job from a RunTask request")
    s.add_argument("--request", help="the RunTask request: a JSON file, '-' for stdin, or inline JSON")
    s.add_argument("--cluster", help="instead of --request: the cluster")
    s.add_argument("--task-definition", help="instead of --request: the task definition")
    s.add_argument("--launch-type", choices=["EC2", "FARGATE", "EXTERNAL"])
    s.add_argument("--capacity-provider", help="a capacity provider (instead of a launch type)")
    s.add_argument("--subnets", help="awsvpc tasks: subnet ids, comma-separated (no public IP is assigned)")
    s.add_argument("--security-groups", help="awsvpc tasks: security group ids, comma-separated")
    s.add_argument("--job-id", help="choose the job's id (a repeated submit returns the same job)")
    s.add_argument(
        "--max-attempts", type=whole(), help="attempts before the job gives up (1-100, default 20)"
    )
    s.add_argument(
        "--max-error-retries", type=whole(), help="relaunches after a task error (0-20, default 0)"
    )
    s.add_argument("--deadline", help="ISO 8601 time with a zone, e.g. 2027-06-01T08:00:00Z")
    s.add_argument("--avoid-pool-seconds", type=whole(), help="how long an interrupted pool is avoided")
    s.add_argument("--checkpoint-container", help="the container that runs the agent (default: the first)")
    s.add_argument("--work-hours", type=number(), help="your estimate of the job's work, in hours of running")
    s.add_argument(
        "--capacity",
        choices=["auto", "fixed"],
        help="auto (default): the policy places each launch in the cluster's pools; fixed: as requested",
    )

    r = actions.add_parser("resubmit", help="start a job that is not running again (or adopt a stopped task)")
    r.add_argument("target", help="a job id, or the ARN of a stopped task")
    r.add_argument("--checkpoint", help="the MANIFEST.json URI to resume from (default: the newest)")

    c = actions.add_parser("cancel", help="stop a job's task and end the job")
    c.add_argument("job_id")
    c.add_argument("--reason", default="cancelled by the user")

    st = actions.add_parser("status", help="a job, its attempts, checkpoints, and what it spent and lost")
    st.add_argument("job_id")
    st.add_argument(
        "--watch", action="store_true", help="ask again every --interval seconds until the job ends"
    )
    st.add_argument(
        "--interval", help=f"seconds between two asks with --watch (default {DEFAULT_INTERVAL:g})"
    )
    st.add_argument("--plot", metavar="FILE", help="draw the job's timeline to FILE (.png, .svg or .pdf)")

    lg = actions.add_parser("logs", help="the job's container logs over all its attempts (CloudWatch Logs)")
    lg.add_argument("job_id")
    lg.add_argument("--follow", "-f", action="store_true", help="keep reading new events until the job ends")
    lg.add_argument(
        "--since", help="only events since: a duration back (90s, 10m, 2h, 1d) or an ISO 8601 time"
    )
    lg.add_argument("--attempt", help="only this attempt's logs (a number; not with --follow)")
    lg.add_argument("--timestamps", action="store_true", help="print each event's time before it")
    lg.add_argument(
        "--interval", help=f"seconds between two polls with --follow (default {DEFAULT_INTERVAL:g})"
    )

    ls = actions.add_parser("list", help="jobs, newest first")
    ls.add_argument("--state", choices=[s.value for s in JobState])
    ls.add_argument("--limit", type=whole(), default=50, help="at most this many (1-500, default 50)")
    p.set_defaults(run=run)


# ------------------------------------------------------------------------------------------ payload
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
            }.items()
            if v is not None
        }
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
        if path.suffix.lower() not in PLOT_SUFFIXES:
            raise CommandError("BadRequest", f"--plot: the file's name ends in {', '.join(PLOT_SUFFIXES)}")
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


# ------------------------------------------------------------------------------------------- invoke
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


def run(
    args: argparse.Namespace,
    invoke: Invoke | None = None,
    out: TextIO = sys.stdout,
    *,
    aws: ClientFactory | None = None,
    clock: Clock | None = None,
    tty: bool | None = None,
) -> int:
    """`aws` (boto3 clients for logs), `clock` (now and sleep, for --follow and --watch) and `tty`
    (whether `out` is a terminal) are for tests; by default the real ones."""
    try:
        body = payload(args)
        parse_command(body)  # the function's own validation, before anything is invoked
    except CommandError as exc:
        print(f"spotguard jobs {args.action}: {as_flags(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"spotguard jobs {args.action}: {exc}", file=sys.stderr)
        return 2
    clock = clock or SystemClock()
    try:
        call = invoke or lambda_invoker(args)
    except Exception as exc:  # no credentials, no such stack, no network: say it in one line
        print(f"spotguard jobs {args.action}: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    if args.action == "logs":
        since = args._since
        if isinstance(since, timedelta):
            since = clock.now() - since
        opts = LogsOptions(
            follow=args.follow,
            since=since,
            attempt=args._attempt,
            timestamps=args.timestamps,
            interval=args._interval,
            as_json=args.json,
        )
        try:
            return run_logs(lambda: call(body), aws or aws_clients(args), clock, opts, out, sys.stderr)
        except KeyboardInterrupt:
            return 130
    if args.action == "status" and args.watch:
        return watch(args, lambda: call(body), out, clock, out.isatty() if tty is None else tty)
    try:
        answer = call(body)
    except Exception as exc:  # no credentials, no such stack, no network: say it in one line
        print(f"spotguard jobs {args.action}: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True), file=out)
    elif not answer.get("ok"):
        err = answer.get("error") or {}
        print(
            f"spotguard jobs {args.action}: {err.get('type', 'Error')}: {err.get('message', '')}",
            file=sys.stderr,
        )
    else:
        print(render(answer), file=out)
    if answer.get("ok") and args.action == "status" and args.plot:
        return 0 if _plot(args, answer, clock) else 1
    return 0 if answer.get("ok") else 1


def _plot(args: argparse.Namespace, answer: dict[str, Any], clock: Clock) -> bool:
    from spotguard_cli.timeline_plot import plot_job

    job = answer.get("job") or {}
    try:
        plot_job(answer, args.plot, now=None if job.get("state") in TERMINAL_STATES else clock.now())
    except (OSError, ValueError) as exc:
        print(f"spotguard jobs status: --plot: {exc}".splitlines()[0], file=sys.stderr)
        return False
    print(f"timeline written to {args.plot}", file=sys.stderr)
    return True


# -------------------------------------------------------------------------------------------- watch
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
            if not answer.get("ok"):
                err = answer.get("error") or {}
                print(
                    f"spotguard jobs status: {err.get('type', 'Error')}: {err.get('message', '')}",
                    file=sys.stderr,
                )
                return 1
            job = answer["job"]
            state = json.dumps({k: v for k, v in job.items() if k != "spend"}, sort_keys=True, default=str)
            ended = job.get("state") in TERMINAL_STATES
            now = clock.now()
            if tty:
                text = json.dumps(answer, indent=2, sort_keys=True) if args.json else render(answer)
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
                    print(f"--- {now:%Y-%m-%d %H:%M:%S} UTC\n{render(answer)}", file=out, flush=True)
            if args.plot and state != last and not _plot(args, answer, clock):
                return 1
            last = state
            if ended:
                return 0
            clock.sleep(args._interval)
    except KeyboardInterrupt:
        print("spotguard jobs status: stopped watching (the job goes on)", file=sys.stderr)
        return 130


# ------------------------------------------------------------------------------------------- tables
def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _short(arn: str | None) -> str:
    return arn.rsplit("/", 1)[-1][:12] if arn else "-"


def _when(iso: str | None) -> str:
    return iso[:19].replace("T", " ") if iso else "-"


def render(answer: dict[str, Any]) -> str:
    if answer.get("jobs") is not None:
        rows = [
            [
                j["job_id"],
                j["state"],
                str(j["gpus"]),
                str(j["attempts"]),
                _short(j["task_arn"]),
                _when(j["updated_at"]),
            ]
            for j in answer["jobs"]
        ]
        return table(rows, ["JOB", "STATE", "GPUS", "ATTEMPTS", "TASK", "UPDATED"]) if rows else "no jobs"
    job = answer["job"]
    attempts = job["attempts"] if isinstance(job["attempts"], int) else len(job["attempts"])
    stopping = answer.get("action") == "cancel" and job.get("state") not in TERMINAL_STATES
    state = "cancelling" if stopping else job["state"]
    lines = [f"job {job['job_id']}: {state}  ({job['gpus']} GPU, {attempts} attempt(s))"]
    if stopping:  # the job reads as it was until its task has stopped: no failed cancel
        lines.append(
            f"  cancel under way: its task is being stopped; the job is {job['state']} until it has, "
            f"then cancelled (follow it: spotguard jobs status {job['job_id']} --watch)"
        )
    lines += [f"  {job['last_reason']}", f"  checkpoints: {job['checkpoint_uri']}"]
    if job.get("retry_at"):
        lines.append(f"  next RunTask try: {_when(job['retry_at'])}")
    if isinstance(job.get("attempts"), list):
        rows = [
            [
                str(a["number"]),
                _short(a["task_arn"]),
                a.get("instance_type") or "-",
                a.get("availability_zone") or "-",
                a.get("lifecycle") or "-",
                _when(a.get("started_at")),
                _when(a.get("stopped_at")),
                a.get("outcome") or a.get("last_status", "-"),
            ]
            for a in job["attempts"]
        ]
        lines += ["", table(rows, ["#", "TASK", "TYPE", "ZONE", "MARKET", "STARTED", "STOPPED", "OUTCOME"])]
        cps = job.get("checkpoints") or []
        if cps:
            newest = cps[-1]
            lines.append(
                f"\n{len(cps)} checkpoint(s); newest #{newest['sequence']} at step {newest['step']} "
                f"({newest['progress']:.0%}) from attempt {newest['attempt']}"
            )
        if job.get("snapshots"):
            lines.append(
                f"EBS snapshots: {', '.join(job['snapshots'])} (the next attempt starts from the last)"
            )
        decisions = job.get("decisions") or []
        if decisions:
            rows = [
                [
                    _when(d.get("at")),
                    d.get("trigger", "-"),
                    d["placement"],
                    d.get("pool") or "-",
                    f"${d['expected_cost']:.2f}" if d.get("expected_cost") is not None else "-",
                    d.get("reason", ""),
                ]
                for d in decisions[-5:]
            ]
            lines += [
                f"\ncapacity decisions ({len(decisions)}, newest last; "
                f"moves made: {job.get('moves_made', 0)}):",
                table(rows, ["AT", "WHY ASKED", "PLACEMENT", "POOL", "TO FINISH", "REASON"]),
            ]
        if job.get("move"):
            to = job["move"]["to"]
            lines.append(f"moving to {to['placement']} {to.get('pool') or ''}: waiting for its checkpoint")
        spend = job.get("spend") or {}
        if spend:
            lines.append(spend_text(spend))
    return "\n".join(lines)


def spend_text(spend: dict[str, Any]) -> str:
    """What a job spent, in words: 'spent 2.32 GPU-hours (0.04 lost), $0.42 ($0.01 lost)'."""
    money = ""
    if spend.get("dollars") is not None:
        money = f", ${spend['dollars']:.2f} (${spend.get('dollars_lost') or 0:.2f} lost)"
    return f"spent {spend['gpu_hours']:.2f} GPU-hours ({spend.get('gpu_hours_lost') or 0:.2f} lost){money}"
