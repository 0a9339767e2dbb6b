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
import sys
from datetime import timedelta
from typing import Any, TextIO

from spotguard.domain.jobs.commands import CommandError, parse_command
from spotguard.domain.jobs.model import JobState
from spotguard_cli.answers import AnswerError, read_answer
from spotguard_cli.arguments import number, whole
from spotguard_cli.clock import Clock, SystemClock
from spotguard_cli.jobs.invoke import Invoke, aws_clients, lambda_invoker
from spotguard_cli.jobs.log_streams import ClientFactory
from spotguard_cli.jobs.logs import Fetch, LogsOptions, run_logs
from spotguard_cli.jobs.payload import (
    DEFAULT_INTERVAL,
    NODE_COUNTS,
    RENDEZVOUS_PORTS,
    as_flags,
    job_spec,
    payload,
)
from spotguard_cli.jobs.registration import submit_spec
from spotguard_cli.jobs.render import plot, render
from spotguard_cli.jobs.spec import family, spec_payload
from spotguard_cli.jobs.watch import watch


def add_parser(sub: Any) -> None:
    p = sub.add_parser("jobs", help="submit, resubmit, cancel and inspect jobs (calls the deployed stack)")
    p.add_argument("--stack", help="the stack's name (default: samconfig.toml's stack_name, else spotguard)")
    p.add_argument("--function", help="the jobs function's name (default: found from the stack)")
    p.add_argument("--region", help="AWS region (default: your AWS configuration)")
    p.add_argument(
        "--endpoint-url",
        help="an AWS endpoint to use instead (the local stack's, printed by spotguard local up)",
    )
    p.add_argument("--json", action="store_true", help="print the function's answer as JSON")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    _add_submit(actions)

    r = actions.add_parser("resubmit", help="start a job that is not running again (or adopt a stopped task)")
    r.add_argument("target", help="a job id, or the ARN of a stopped task")
    r.add_argument("--checkpoint", help="the MANIFEST.json URI to resume from (default: the newest)")

    c = actions.add_parser("cancel", help="stop a job's task and end the job")
    c.add_argument("job_id")
    c.add_argument(
        "--reason",
        default="cancelled by the user",
        help="why, kept on the job and in its notification (at most 200 characters)",
    )

    _add_status(actions)
    _add_logs(actions)

    ls = actions.add_parser("list", help="jobs, newest first")
    ls.add_argument("--state", choices=[s.value for s in JobState])
    ls.add_argument("--limit", type=whole(), default=50, help="at most this many (1-500, default 50)")
    p.set_defaults(run=run)


def _add_submit(actions: Any) -> None:
    """`jobs submit`: a job spec, or a RunTask request, and the flags over it."""
    s = actions.add_parser("submit", help="start a job from a job spec (or a RunTask request)")
    s.add_argument(
        "spec",
        nargs="?",
        help="a job spec, YAML or JSON (image, command, gpus, checkpoint_dir, ...; docs/jobs.md); "
        "the flags below override its fields",
    )
    s.add_argument("--image", help="the container image (SpotGuard registers the task definition)")
    s.add_argument("--command", help="what the container runs, e.g. 'python train.py --epochs 90'")
    s.add_argument("--gpus", type=whole(), help="GPUs per instance (1-8, default 1)")
    s.add_argument(
        "--checkpoint-dir",
        help="the directory the job saves to in the container: the agent restores and commits it",
    )
    s.add_argument(
        "--env", action="append", metavar="NAME=VALUE", help="an environment variable (repeat the flag)"
    )
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
    s.add_argument(
        "--nodes",
        type=whole(*NODE_COUNTS),
        help=f"instances the job runs on together, one task each (1-{NODE_COUNTS[1]}, default 1); "
        "SpotGuard gives each task its node rank and node 0's address (torchrun's PET_ variables)",
    )
    s.add_argument(
        "--rendezvous-port",
        type=whole(*RENDEZVOUS_PORTS),
        help="the port node 0 hosts the rendezvous on, torchrun's --master-port (default 29500)",
    )


def _add_status(actions: Any) -> None:
    """`jobs status`: once, --watch, or --plot."""
    st = actions.add_parser("status", help="a job, its attempts, checkpoints, and what it spent and lost")
    st.add_argument("job_id")
    st.add_argument(
        "--watch", action="store_true", help="ask again every --interval seconds until the job ends"
    )
    st.add_argument(
        "--interval", help=f"seconds between two asks with --watch (default {DEFAULT_INTERVAL:g})"
    )
    st.add_argument("--plot", metavar="FILE", help="draw the job's timeline to FILE (.png, .svg or .pdf)")


def _add_logs(actions: Any) -> None:
    """`jobs logs`: which attempt, node and time, and --follow."""
    lg = actions.add_parser("logs", help="the job's container logs over all its attempts (CloudWatch Logs)")
    lg.add_argument("job_id")
    lg.add_argument("--follow", "-f", action="store_true", help="keep reading new events until the job ends")
    lg.add_argument(
        "--since", help="only events since: a duration back (90s, 10m, 2h, 1d) or an ISO 8601 time"
    )
    lg.add_argument("--attempt", help="only this attempt's logs (a number; not with --follow)")
    lg.add_argument(
        "--node",
        type=whole(0, NODE_COUNTS[1] - 1),
        help="a multi-node job: only this node's logs (0 is the first; default every node's, each line "
        "named [node K])",
    )
    lg.add_argument("--timestamps", action="store_true", help="print each event's time before it")
    lg.add_argument(
        "--interval", help=f"seconds between two polls with --follow (default {DEFAULT_INTERVAL:g})"
    )


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
    spec = None
    try:
        spec = job_spec(args)
        body = payload(args) if spec is None else spec_payload(spec, family(spec))
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
        return _logs(args, lambda: call(body), aws, clock, out)
    if args.action == "status" and args.watch:
        return watch(args, lambda: call(body), out, clock, out.isatty() if tty is None else tty)
    try:
        if spec is not None:  # the task definition, registered (or found) with your credentials
            body = submit_spec(spec, aws or aws_clients(args))
        answer = call(body)
    except CommandError as exc:
        print(f"spotguard jobs {args.action}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # no credentials, no such stack, no network: say it in one line
        print(f"spotguard jobs {args.action}: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True), file=out)
    try:
        read = read_answer(answer)
    except AnswerError as exc:
        print(f"spotguard jobs {args.action}: {exc}", file=sys.stderr)
        return 1
    if not read.ok:
        if not args.json:
            print(f"spotguard jobs {args.action}: {read.error_line()}", file=sys.stderr)
        return 1
    if not args.json:
        print(render(read), file=out)
        ended = read.job.state if args.action == "submit" and read.job is not None else None
        if ended in ("succeeded", "failed", "cancelled", "gave-up"):  # a name already used, by a job ended
            name = read.job.job_id if read.job is not None else ""
            print(
                f"spotguard jobs submit: job {name} exists and has {ended}: nothing started; "
                f"`spotguard jobs resubmit {name}` runs it again, or give the job another name",
                file=sys.stderr,
            )
    if args.action == "status" and args.plot:
        return 0 if plot(args.plot, read, clock) else 1
    return 0


def _logs(
    args: argparse.Namespace, fetch: Fetch, aws: ClientFactory | None, clock: Clock, out: TextIO
) -> int:
    """`jobs logs`: the flags turned into the logs' options, and the logs read (`fetch`: the job's status)."""
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
        node=args.node,
    )
    try:
        return run_logs(fetch, aws or aws_clients(args), clock, opts, out, sys.stderr)
    except KeyboardInterrupt:
        return 130
