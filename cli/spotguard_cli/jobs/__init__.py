"""`spotguard jobs`: the deployed jobs function, from a shell.

command.py  the flags, and what a run does: one invocation, --watch, or logs
payload.py  the flags turned into the function's payload, checked before anything is invoked
invoke.py   the function found from the stack and invoked; boto3 clients for the logs
watch.py    `status --watch`: asked again until the job ends
render.py   the answers as tables, what a job spent in words, the `--plot` picture
logs.py     `jobs logs`: a job's container logs over all its attempts
"""

from spotguard_cli.jobs.command import add_parser, run
from spotguard_cli.jobs.invoke import stack_name
from spotguard_cli.jobs.payload import payload
from spotguard_cli.jobs.render import render, spend_text

__all__ = ["add_parser", "payload", "render", "run", "spend_text", "stack_name"]
