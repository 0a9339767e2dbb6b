"""Bad input is reported in one line: where, and what is wrong."""

from __future__ import annotations

from pydantic import ValidationError


def one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "value"
    msg = str(err["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {msg}{more}"


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
