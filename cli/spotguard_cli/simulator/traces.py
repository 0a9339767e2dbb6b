"""Spot availability traces: the file format, loading and checking it, and a trace's head.

A trace is `{"metadata": {"gap_seconds": G}, "data": [1, 0, ...]}`: data[i] covers [i*G, (i+1)*G) from
the trace start; a value of 1 or more means spot could be had. Several traces given together as pools
are simultaneous alternatives (cut to the shortest).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be used, said in one line."""


@dataclass(frozen=True)
class Trace:
    name: str
    gap_hours: float
    available: tuple[bool, ...]

    def head(self, hours: float) -> Trace:
        return Trace(self.name, self.gap_hours, self.available[: round(hours / self.gap_hours)])


def load_trace(path: str | Path) -> Trace:
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise TraceError(
            f"{p}: cannot read: no such file (the Can't Be Late spot traces are fetched with `make traces`, "
            "into .traces/cant-be-late-2022-10/)"
        ) from None
    except OSError as exc:
        raise TraceError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TraceError(f"{p}: not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise TraceError(f"{p}: expected an object with a 'data' list")
    gap = (raw.get("metadata") or {}).get("gap_seconds") if isinstance(raw.get("metadata"), dict) else None
    if not isinstance(gap, (int, float)) or isinstance(gap, bool) or gap <= 0:
        raise TraceError(f"{p}: metadata.gap_seconds must be a positive number")
    data = raw["data"]
    bad = next(
        (i for i, v in enumerate(data) if isinstance(v, bool) or not isinstance(v, (int, float))), None
    )
    if bad is not None:
        raise TraceError(f"{p}: data[{bad}] is {data[bad]!r}, not a number")
    if not data:
        raise TraceError(f"{p}: data is empty")
    return Trace(p.stem, gap / 3600.0, tuple(v >= 1 for v in data))
