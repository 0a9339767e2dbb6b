"""`spotguard jobs`: the deployed jobs function, from a shell (command.py; logs.py is `jobs logs`)."""

from spotguard_cli.jobs.command import add_parser, payload, render, run, spend_text, stack_name

__all__ = ["add_parser", "payload", "render", "run", "spend_text", "stack_name"]
