"""Spot availability traces made for the replay's tests (no real trace is needed, or copied): four days of
ten-minute ticks, in the format of the Can't Be Late traces (docs/traces.md). Pool a loses spot for an
hour every five hours, pool b for two hours every seven hours, from different offsets, so both are out
together now and then."""

from __future__ import annotations

import json
from pathlib import Path

TICKS_PER_HOUR = 6
DAYS = 4


def availability(period_hours: int, out_hours: int, offset_hours: int) -> list[int]:
    ticks = DAYS * 24 * TICKS_PER_HOUR
    out = set()
    for start in range(offset_hours, DAYS * 24, period_hours):
        out.update(range(start * TICKS_PER_HOUR, (start + out_hours) * TICKS_PER_HOUR))
    return [0 if i in out else 1 for i in range(ticks)]


def write_traces(folder: Path) -> tuple[Path, Path]:
    paths = []
    for name, data in (("pool-a", availability(5, 1, 2)), ("pool-b", availability(7, 2, 4))):
        path = folder / f"{name}.json"
        path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": data}))
        paths.append(path)
    return paths[0], paths[1]
