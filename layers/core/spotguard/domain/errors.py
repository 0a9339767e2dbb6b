"""Bad input is reported in one line: where, and what is wrong."""

from __future__ import annotations

from pydantic import ValidationError


def one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "value"
    msg = str(err["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {msg}{more}"
