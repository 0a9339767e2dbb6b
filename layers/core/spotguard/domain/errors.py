"""Bad input is reported in one line: where, and what is wrong."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

# pydantic names each member of a union it tried in an error's location ('dict[str,any]',
# 'is-subclass[BaseModel]', 'function-after[_check(), str]', 'str', 'BaseModel'): a type, not a field
_TYPE_TAG = re.compile(r"[\[\](), ]")
_TYPE_NAMES = frozenset(
    # names no JSON field of SpotGuard's inputs has ('time', 'url', 'model' are left to the brackets)
    ("str", "int", "float", "bool", "bytes", "decimal", "uuid", "BaseModel", "constrained-str")
)
TIME_EXAMPLE = "2027-06-01T18:00:00Z"
MAX_NAMED = 8  # more errors than this in one input: the rest are counted, not named


def _is_type_tag(part: object) -> bool:
    return isinstance(part, str) and (bool(_TYPE_TAG.search(part)) or part in _TYPE_NAMES)


def where(errors: Sequence[Any], tagged: bool = False) -> list[str]:
    """Each error's location as the input names it: without a tagged union's tag (the first part when
    the whole input is one: the jobs command's `submit.request.cluster` is the input's `request.cluster`)
    and without the union members pydantic tried (`detail.dict[str,any]` is `detail`). A part at the
    same place as a type tag in another error's location is a union member too (`BaseModel` beside
    `dict[str,any]`)."""
    locs = [tuple(e["loc"][1:] if tagged else e["loc"]) for e in errors]
    unions = {loc[:i] for loc in locs for i, part in enumerate(loc) if _is_type_tag(part)}
    return [
        ".".join(str(p) for i, p in enumerate(loc) if not (_is_type_tag(p) or loc[:i] in unions)) or "value"
        for loc in locs
    ]


def message(err: Any) -> str:
    """pydantic's message, with what a time should look like where one was expected."""
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    msg = " ".join(msg.replace("a valid dictionary", "a JSON object").split())
    kind = str(err.get("type", ""))
    if kind.startswith(("datetime_", "date_")) or kind in ("timezone_aware", "timezone_naive"):
        given = err.get("input")
        shown = f", not {given!r}" if isinstance(given, str) and len(given) <= 40 else ""
        return f"expected an ISO 8601 time with a time zone, e.g. {TIME_EXAMPLE}{shown}"
    return msg


def one_line(exc: ValidationError) -> str:
    """Every error of `exc` in one line, `where: what` each, the places with the same complaint named
    together: `request.cluster, request.taskDefinition: Field required; options.max_attempts: ...`.
    Where pydantic tried several members of a union at one place, the first member's complaint stands
    for them all."""
    errors = exc.errors()
    if not errors:
        return "value: not valid"
    places = where(errors, tagged=str(exc.title).startswith("tagged-union["))
    said: dict[str, list[str]] = {}  # complaint -> places, in the order first met
    seen: set[str] = set()
    for place, err in zip(places, errors, strict=True):
        if place in seen:
            continue
        seen.add(place)
        said.setdefault(message(err), []).append(place)
    parts, named = [], 0
    for what, at in said.items():
        room = MAX_NAMED - named
        if room <= 0:
            break
        parts.append(f"{', '.join(at[:room])}: {what}")
        named += min(len(at), room)
    rest = len(seen) - named
    # one line whatever the input put in it: a key or value holding a newline is written as its escape
    return printable("; ".join(parts) + (f" (and {rest} more)" if rest > 0 else ""))


def printable(text: str) -> str:
    """`text` with every character that is not printable written as its escape, so it stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


MAX_DEPTH = 64  # far deeper than any real event or request; deeper input is refused before it is read


def too_deep(value: object, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON-like data nests deeper than `limit` (lists and objects), found without recursion so
    that absurd input cannot raise RecursionError in the code that refuses it."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: list[object] = list(node.values())
        elif isinstance(node, list | tuple):
            children = list(node)
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False
