"""Progress of long work on stderr (tqdm), for `spotguard simulate` and the benchmarks in bench/.

A bar is shown only where someone watches: on a terminal (stderr a TTY) and when the caller has not asked
for machine output (`enabled=False`, e.g. with --json). Otherwise `progress` returns a bar that does
nothing, so the callers count their work the same way either way. Nothing here writes to stdout except
`echo`, which prints exactly what `print` would, clearing a bar that is up first so the two do not mix on
one terminal line.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import IO, Any, Protocol


class Bar(Protocol):
    n: float

    def update(self, n: float = 1) -> bool | None: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Bar: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any: ...


class NoBar:
    """A bar that shows nothing: progress is off."""

    def __init__(self, total: float | None = None) -> None:
        self.total = total
        self.n: float = 0

    def update(self, n: float = 1) -> None:
        self.n += n

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NoBar:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def is_tty(stream: IO[str] | None) -> bool:
    try:
        return stream is not None and not stream.closed and stream.isatty()
    except (AttributeError, ValueError):  # a stream with no isatty, or a closed one
        return False


def progress(
    total: float | None,
    desc: str,
    enabled: bool = True,
    *,
    unit: str = "it",
    stream: IO[str] | None = None,
) -> Bar:
    """A tqdm bar on `stream` (stderr by default) counting `total` units of work, with the rate and an
    estimate of the time left; a `NoBar` when not `enabled` or when the stream is not a terminal. The
    bar is erased when closed (use it as a context manager), leaving the terminal to the command's output.
    """
    stream = sys.stderr if stream is None else stream
    if not enabled or not is_tty(stream):
        return NoBar(total)
    from tqdm import tqdm  # only when a bar is shown

    return tqdm(total=total, desc=desc, unit=unit, file=stream, leave=False, dynamic_ncols=True)


def echo(text: str = "", *, flush: bool = False) -> None:
    """`print(text)` to stdout, the same bytes, with any bar that is up cleared first and redrawn after."""
    if "tqdm" not in sys.modules:  # no bar was ever shown
        print(text, flush=flush)
        return
    from tqdm import tqdm

    tqdm.write(text)  # to sys.stdout: `text` then "\n", as print
    if flush:
        sys.stdout.flush()
