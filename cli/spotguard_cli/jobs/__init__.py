"""`spotguard jobs`: the deployed jobs function, from a shell.

command.py       the flags, and what a run does: one invocation, --watch, or logs
payload.py       the flags turned into the function's payload, checked before anything is invoked
spec.py          a job spec, read and checked, and the task definition and RunTask request it becomes
registration.py  the spec's task definition registered with ECS (or found), and its submit payload
invoke.py        the function found from the stack and invoked; boto3 clients for the logs
watch.py         `status --watch`: asked again until the job ends
render.py        the answers as tables, what a job spent in words, the `--plot` picture
logs.py          `jobs logs`: a job's container logs over all its attempts
log_streams.py   where an attempt's logs are (its tasks' awslogs streams)
log_cursor.py    an attempt's log events, read from where the last read stopped
log_lines.py     the lines around an attempt's logs: its header, why it stopped, the job's end
"""

from spotguard_cli.jobs.command import add_parser, run
from spotguard_cli.jobs.invoke import stack_name
from spotguard_cli.jobs.payload import payload
from spotguard_cli.jobs.render import render, spend_text

__all__ = ["add_parser", "payload", "render", "run", "spend_text", "stack_name"]
