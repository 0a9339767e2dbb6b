"""A job's timeline as a picture, from the jobs function's `status` answer alone (its JSON).

    from spotguard_cli.timeline_plot import plot_job
    plot_job(answer, "job.png")      # the whole answer {"ok": ..., "job": {...}}, its "job", or that read

One horizontal bar per attempt, from its task's start (its launch, while it had not started) to its stop
(or `now` while it runs), coloured by market (spot, on-demand, unknown) and labelled by pool; a thin
line before a bar is the time the task waited for an instance. Interruptions are red crosses at the
stop, moves by SpotGuard black arrows, committed checkpoints ticks on their attempt's bar; the deadline
is a dashed line, and the title says what the job spent so far when the answer has it.

matplotlib is imported here only (Agg backend, no display) and the figure is not kept by pyplot, so a
long-running caller (the local demo) can draw as often as it likes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from spotguard.domain.jobs.model import TERMINAL  # a job's states once it has ended
from spotguard_cli.answers import AttemptView, StatusView, read_status

COLOURS = {"spot": "#2b8cbe", "on-demand": "#f03b20", None: "#999999"}


@dataclass(frozen=True)
class Bar:
    attempt: int
    start: datetime
    end: datetime
    market: str | None
    label: str
    running: bool


@dataclass
class Timeline:
    """What was drawn (for tests and callers that annotate further): the figure, and one bar per
    attempt that has a launch time."""

    figure: Any
    bars: list[Bar] = field(default_factory=list)
    interruptions: list[datetime] = field(default_factory=list)
    moves: list[datetime] = field(default_factory=list)
    checkpoints: list[datetime] = field(default_factory=list)
    deadline_note: str | None = None  # a deadline far beyond the activity: said at the edge, not drawn


# A deadline further from the activity than this many times its span is said at the axis's right edge
# rather than drawn: a 30-second run with a 48-hour deadline would be a mark at the left of a two-day axis.
FAR_DEADLINE_SPANS = 3.0


def _latest(job: StatusView) -> datetime | None:
    """The newest time the answer mentions: where a running attempt's bar ends without `now`."""
    times = [job.updated_at]
    for a in job.attempts:
        times += [a.launched_at, a.started_at, a.stopped_at]
    times += [c.created_at for c in job.checkpoints]
    times += [d.at for d in job.decisions]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _market(a: AttemptView) -> str | None:
    market = a.market or a.lifecycle
    return market if market in ("spot", "on-demand") else None


def _label(a: AttemptView) -> str:
    pool = a.pool or " ".join(x for x in (a.instance_type, a.availability_zone) if x)
    return f"#{a.number} {pool}".strip()


def bars_of(job: StatusView, now: datetime | None = None) -> list[Bar]:
    end_of_live = now or _latest(job)
    bars = []
    for a in job.attempts:
        start = a.started_at or a.launched_at
        if start is None:
            continue
        end = a.stopped_at or end_of_live or start
        bars.append(Bar(a.number, start, max(end, start), _market(a), _label(a), a.stopped_at is None))
    return bars


def _title(job: StatusView, prices_note: str | None = None) -> str:
    """'job J: running - $1.20 so far'; for a job that has ended, what it spent ('- spent $3.40');
    `prices_note` says what the dollars are worth (the local stack's placeholder prices)."""
    title = f"job {job.job_id or '?'}: {job.state or '?'}"
    ended = job.state in TERMINAL
    spend = job.spend
    if spend is None:
        return title
    if spend.dollars is not None:
        lost = spend.dollars_lost
        money = f"${spend.dollars:,.2f}"
        title += f" - spent {money}" if ended else f" - {money} so far"
        title += f" (${lost:,.2f} lost)" if lost else ""
        if prices_note:
            title += f" at {prices_note}"
    else:
        hours = f"{spend.gpu_hours:,.2f} GPU-hours"
        title += f" - spent {hours}" if ended else f" - {hours} so far"
    return title


def plot_job(
    status: StatusView | Mapping[str, Any],
    path: str,
    *,
    now: datetime | None = None,
    prices_note: str | None = None,
) -> Timeline:
    """Draw the job's timeline to `path` (png, svg or pdf, by its suffix). `now` ends a running attempt's
    bar (default: the newest time in the answer); `prices_note` follows the dollars in the title (the
    local stack: "moto's placeholder prices"). Returns what it drew; callers may ignore it. An answer that
    is no status is an AnswerError (a ValueError), in one line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    job = read_status(status)
    bars = bars_of(job, now)
    rows = {b.attempt: i for i, b in enumerate(bars)}
    fig = Figure(figsize=(10, 1.6 + 0.55 * max(len(bars), 1)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    drawn = Timeline(figure=fig, bars=bars)

    _draw_attempts(ax, job, bars, rows, drawn)
    _draw_checkpoints(ax, job, rows, drawn)
    deadline = _draw_deadline(ax, job, bars, drawn)
    _label_axes(ax, job, bars, prices_note)
    handles = _legend_handles(bars, drawn, deadline)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=len(handles), fontsize=8,
              frameon=False)  # fmt: skip
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return drawn


def _draw_attempts(ax: Any, job: StatusView, bars: list[Bar], rows: dict[int, int], drawn: Timeline) -> None:
    """A bar per attempt, the wait for its instance before it, and how it stopped (moved, interrupted)."""
    from matplotlib import dates as mdates

    for b in bars:
        y = rows[b.attempt]
        left = mdates.date2num(b.start)
        width = max(mdates.date2num(b.end) - left, 1e-6)
        ax.barh(
            y, width, left=left, height=0.5, color=COLOURS.get(b.market, COLOURS[None]),
            hatch="//" if b.running else None, edgecolor="white" if b.running else None,
        )  # fmt: skip
    for a in job.attempts:
        if a.number not in rows:
            continue
        y = rows[a.number]
        launched, started = a.launched_at, a.started_at
        if launched and started and started > launched:  # waiting for an instance
            ax.hlines(y, mdates.date2num(launched), mdates.date2num(started), colors="#555555", lw=1)
        stopped = a.stopped_at
        if stopped is None:
            continue
        if (a.outcome_reason or "").startswith("moved: "):
            drawn.moves.append(stopped)
            ax.plot(mdates.date2num(stopped), y, marker=">", color="black", ms=10, zorder=3)
        elif a.interrupted_by:
            drawn.interruptions.append(stopped)
            ax.plot(mdates.date2num(stopped), y, marker="X", color="#d7191c", ms=11, mec="black", zorder=3)


def _draw_checkpoints(ax: Any, job: StatusView, rows: dict[int, int], drawn: Timeline) -> None:
    """A tick per committed checkpoint on its attempt's bar, and a move under way."""
    from matplotlib import dates as mdates

    for c in job.checkpoints:
        at = c.created_at
        if at is None or c.attempt not in rows:
            continue
        drawn.checkpoints.append(at)
        ax.plot(mdates.date2num(at), rows[c.attempt], marker="|", color="black", ms=14, mew=1.5, zorder=3)
    move = job.move  # a move under way: asked to checkpoint
    if move is not None and move.requested_at is not None and move.attempt in rows:
        drawn.moves.append(move.requested_at)
        at, y = mdates.date2num(move.requested_at), rows[move.attempt]
        ax.plot(at, y, marker=">", color="black", mfc="white", ms=10)


def _draw_deadline(ax: Any, job: StatusView, bars: list[Bar], drawn: Timeline) -> datetime | None:
    """The deadline as a dashed line, or said at the axis's edge when it is far beyond the activity; the
    deadline drawn (None: none, or said only)."""
    from matplotlib import dates as mdates

    deadline = job.options.deadline
    if deadline is not None and bars:
        first, last = min(b.start for b in bars), max(b.end for b in bars)
        span = max((last - first).total_seconds(), 1.0)
        if (deadline - last).total_seconds() > FAR_DEADLINE_SPANS * span:
            margin = (last - first) * 0.05
            ax.set_xlim(mdates.date2num(first - margin), mdates.date2num(last + margin))
            left = (deadline - last).total_seconds() / 3600
            drawn.deadline_note = f"deadline {deadline:%Y-%m-%d %H:%M} UTC, {left:.1f} h after this ->"
            ax.text(
                0.995, 1.01, drawn.deadline_note, transform=ax.transAxes, ha="right", va="bottom", fontsize=8
            )
            deadline = None  # said, not drawn
    if deadline is not None:
        ax.axvline(mdates.date2num(deadline), color="black", ls="--", lw=1)
    return deadline


def _label_axes(ax: Any, job: StatusView, bars: list[Bar], prices_note: str | None) -> None:
    """The attempts' labels, the time axis, the title and the grid."""
    from matplotlib import dates as mdates

    ax.set_yticks(range(len(bars)), [b.label for b in bars])
    ax.set_ylim(-0.75, max(len(bars), 1) - 0.25)
    ax.invert_yaxis()  # attempt 1 at the top
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_xlabel("UTC")
    ax.set_title(_title(job, prices_note), parse_math=False)  # "$" is money here
    ax.grid(axis="x", alpha=0.3)
    if not bars:
        ax.text(0.5, 0.5, "no attempt yet", transform=ax.transAxes, ha="center", va="center")


def _legend_handles(bars: list[Bar], drawn: Timeline, deadline: datetime | None) -> list[Any]:
    """The legend's entries: the markets drawn, and each kind of mark there is."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    markets = {b.market for b in bars}
    handles = [
        Patch(color=COLOURS[m], label=name)
        for m, name in (("spot", "spot"), ("on-demand", "on-demand"), (None, "market unknown"))
        if m in markets or (m == "spot" and not bars)
    ]
    if drawn.interruptions:
        handles.append(
            Line2D([], [], marker="X", color="#d7191c", mec="black", ls="", ms=9, label="interrupted")
        )
    if drawn.moves:
        handles.append(Line2D([], [], marker=">", color="black", ls="", ms=8, label="moved by SpotGuard"))
    if drawn.checkpoints:
        handles.append(Line2D([], [], marker="|", color="black", ls="", ms=10, mew=1.5, label="checkpoint"))
    if any(b.running for b in bars):
        handles.append(Patch(facecolor="#cccccc", hatch="//", edgecolor="white", label="running"))
    if deadline is not None:
        handles.append(Line2D([], [], color="black", ls="--", lw=1, label="deadline"))
    return handles
