"""The CLI's argument types and its one-line argument errors, for every command.

A type here turns the text of one flag into its value, or refuses it with what is expected; argparse puts
the flag's name in front: `spotguard local inject: argument --for: 'abc' is not a number`. Bad arguments
are then one line on stderr and exit status 2 (`one_line_errors`), never a usage block or a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def _text(value: float) -> str:
    return f"{value:g}"


def _range(low: float | None, high: float | None, low_open: bool, of: str) -> str:
    """What is expected, in words: 'a number > 0', 'a number of seconds from 0 to 60'."""
    if low is not None and high is not None:
        if low_open:
            return f"{of} > {_text(low)} and at most {_text(high)}"
        return f"{of} from {_text(low)} to {_text(high)}"
    if low is not None:
        return f"{of} {'>' if low_open else '>='} {_text(low)}"
    if high is not None:
        return f"{of} at most {_text(high)}"
    return of


def number(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, unit: str = ""
) -> Callable[[str], float]:
    """A finite number within [low, high] ((low, high] with `low_open`); `unit` names what it counts
    ('seconds': "'abc' is not a number of seconds")."""
    of = f"a number of {unit}" if unit else "a number"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {of}") from None
        if (
            not math.isfinite(value)
            or (low is not None and (value <= low if low_open else value < low))
            or (high is not None and value > high)
        ):
            raise argparse.ArgumentTypeError(f"must be {_range(low, high, low_open, of)}, not {text}")
        return value

    parse.__name__ = "number"
    return parse


def whole(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """A whole number within [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if low is not None and high is None and value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"must be {_range(low, high, False, 'a whole number')}, not {value}"
            )
        return value

    parse.__name__ = "whole number"
    return parse


def positive(kind: str = "", strict: bool = True) -> Callable[[str], float]:
    """A number > 0 (>= 0 unless `strict`). `kind` is the flag, named by argparse already."""
    del kind
    return number(0, low_open=strict)


def count(text: str) -> int:
    """A whole number, at least 1."""
    return whole(1)(text)


def seed(text: str) -> int:
    """Any whole number."""
    return whole()(text)


PICTURE_SUFFIXES = (".png", ".svg", ".pdf")


def picture_file(text: str) -> str:
    """A picture to write: its name ends in .png, .svg or .pdf, in a directory that exists and can be
    written to (checked before any work starts, not after)."""
    path = Path(text)
    if path.suffix.lower() not in PICTURE_SUFFIXES:
        raise argparse.ArgumentTypeError(f"the file's name ends in {', '.join(PICTURE_SUFFIXES)}, not {text}")
    where = path.parent
    if not where.is_dir():
        raise argparse.ArgumentTypeError(f"no such directory: {where}")
    if not os.access(where, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write there: {path}")
    return text


picture_file.__name__ = "file"


def one_line_errors(parser: argparse.ArgumentParser, prog: str | None = None) -> None:
    """Bad arguments: one line on stderr, `<prog>: <what is wrong>`, and exit status 2."""
    name = prog or parser.prog

    def one_line_error(message: str) -> NoReturn:
        text = " ".join(message.split())
        if text.startswith("the following arguments are required"):
            text += f" (see {name} --help)"
        print(f"{name}: {text}", file=sys.stderr)
        sys.exit(2)

    parser.error = one_line_error  # type: ignore[method-assign]


def one_line_errors_everywhere(parser: argparse.ArgumentParser) -> None:
    """`one_line_errors` for `parser` and every subcommand's parser under it."""
    one_line_errors(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                one_line_errors_everywhere(sub)


def checkpoint_directory(path: str) -> str:
    """The checkpoint directory in the container, normalised (`//ck/./x/` is `/ck/x`); ValueError in one
    line for one that is not an absolute path below the root, or that names its way up (`..`) or holds a
    control character."""
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise ValueError("a path without control characters (a newline, a tab, NUL)")
    if not path.startswith("/"):
        raise ValueError(f"must be an absolute path in the container (e.g. /opt/checkpoints), not {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError("an absolute path without ..")
    if not parts:
        raise ValueError(
            f"{path!r} is the container's root: name a directory below it (e.g. /opt/checkpoints)"
        )
    return "/" + "/".join(parts)
