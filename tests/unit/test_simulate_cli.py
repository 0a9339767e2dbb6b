"""`spotguard simulate`: the JSON contract, the table, the plot, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotguard_cli.main import main
from spotguard_cli.simulate import draw_starts
from spotguard_cli.simulator import Job, TraceError, load_trace


def write(path: Path, data: list[int], gap: int = 3600) -> str:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return str(path)


@pytest.fixture
def traces(tmp_path: Path) -> list[str]:
    a = write(tmp_path / "a.json", [1, 1, 0, 0, 1, 1, 1, 0] * 6)
    b = write(tmp_path / "b.json", [0, 1, 1, 1, 1, 0, 0, 1] * 6)
    return [a, b]


ARGS = [
    "--job-hours",
    "4",
    "--deadline-hours",
    "8",
    "--restart-hours",
    "0.5",
    "--samples",
    "5",
    "--seed",
    "3",
]


def test_json_has_the_contract_fields(traces, capsys):
    assert main(["simulate", "--policy", "spotguard", "--trace", traces[0], *ARGS, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {
        "policy",
        "runs",
        "deadline_misses",
        "mean_cost",
        "mean_ondemand_hours",
        "mean_spot_hours",
        "cost_vs_ondemand",
        "mean_hours_to_finish",
        "mean_idle_with_spot_hours",
    } <= out.keys()
    assert out["policy"] == "spotguard" and out["runs"] == 5 and out["deadline_misses"] == 0
    assert out["mean_hours_to_finish"] >= 4.0 and out["mean_idle_with_spot_hours"] >= 0.0
    assert out["mean_ondemand_hours"] + out["mean_spot_hours"] == pytest.approx(4.0)


def test_all_on_demand_costs_exactly_the_reference(traces, capsys):
    assert (
        main(
            [
                "simulate",
                "--policy",
                "on-demand",
                "--trace",
                traces[0],
                *ARGS,
                "--json",
                "--ondemand-price",
                "2",
                "--spot-price",
                "1",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["mean_cost"] == pytest.approx(2 * 4.5) and out["cost_vs_ondemand"] == pytest.approx(1.0)


def test_each_trace_is_a_pool_or_they_are_pools_together(traces, capsys):
    main(["simulate", "--policy", "greedy", "--trace", traces[0], "--trace", traces[1], *ARGS, "--json"])
    single = json.loads(capsys.readouterr().out)
    main(
        [
            "simulate",
            "--policy",
            "greedy",
            "--multi-pool",
            "--trace",
            traces[0],
            "--trace",
            traces[1],
            *ARGS,
            "--json",
        ]
    )
    multi = json.loads(capsys.readouterr().out)
    assert single["runs"] == 10 and [p["traces"] for p in single["pools"]] == [["a"], ["b"]]
    assert multi["runs"] == 5 and multi["pools"][0]["traces"] == ["a", "b"]


def test_the_omniscient_bound_is_never_beaten(traces, capsys):
    policies = ["on-demand", "greedy", "uniform-progress", "spotguard", "omniscient"]
    argv = ["simulate", *[x for p in policies for x in ("--policy", p)], "--multi-pool"]
    assert main([*argv, "--trace", traces[0], "--trace", traces[1], *ARGS, "--json"]) == 0
    out = {r["policy"]: r["mean_cost"] for r in json.loads(capsys.readouterr().out)}
    assert all(out["omniscient"] <= cost + 1e-9 for cost in out.values())


def test_the_table_and_the_plot(traces, tmp_path, capsys):
    png = tmp_path / "cost.png"
    assert (
        main(
            [
                "simulate",
                "--policy",
                "greedy",
                "--policy",
                "spotguard",
                "--trace",
                traces[0],
                *ARGS,
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "greedy" in out and "spotguard" in out and "misses" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def run_with(traces: list[str], change: list[str]) -> int:
    args = dict(zip(ARGS[::2], ARGS[1::2], strict=True))
    args.update(dict(zip(change[::2], change[1::2], strict=True)))
    argv = ["simulate", "--policy", "greedy", "--trace", traces[0], *[x for kv in args.items() for x in kv]]
    try:
        return main(argv)
    except SystemExit as exc:  # argparse refuses it before the command runs
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--deadline-hours", "4"], "cannot meet a 4.0 h deadline even on on-demand"),
        (["--deadline-hours", "100"], "h of trace, the deadline needs 100 h"),
        (["--samples", "0"], "must be at least 1"),
        (["--job-hours", "x"], "'x' is not a number"),
        (["--restart-hours", "-1"], "argument --restart-hours: must be a number >= 0, not -1"),
        (["--spot-price", "5"], "--spot-price is above --ondemand-price"),
        (["--seed", "1.5"], "'1.5' is not a whole number"),
    ],
)
def test_bad_arguments_get_one_line(traces, capsys, change, message):
    assert run_with(traces, change) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("spotguard simulate: ") and message in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not JSON"),
        ('{"metadata": {"gap_seconds": 600}}', "expected an object with a 'data' list"),
        ('{"metadata": {"gap_seconds": 0}, "data": [1]}', "gap_seconds must be a positive number"),
        ('{"metadata": {"gap_seconds": 3600}, "data": [1, "x"]}', "data[1] is 'x', not a number"),
    ],
)
def test_bad_traces_get_one_line(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["simulate", "--policy", "greedy", "--trace", str(bad), *ARGS]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_traces_with_different_ticks_are_refused(tmp_path, traces, capsys):
    other = write(tmp_path / "c.json", [1] * 100, gap=600)
    assert main(["simulate", "--policy", "greedy", "--trace", traces[0], "--trace", other, *ARGS]) == 2
    assert "different gap_seconds" in capsys.readouterr().err


def test_starts_can_be_kept_after_a_stretch_of_history(traces):
    """A benchmark on a later stretch: every start after `earliest_hours`, with room for the deadline."""
    loaded = [load_trace(t) for t in traces]  # 48 one-hour ticks each
    job = Job(4.0, 8.0, 0.5)
    late = draw_starts(loaded, job, 50, 7, multi_pool=False, earliest_hours=30)
    assert all(30 <= r.start <= 48 - 8 for r in late) and len(late) == 100
    assert len({r.start for r in late}) > 5
    whole = draw_starts(loaded, job, 50, 7, multi_pool=False)
    assert all(0 <= r.start <= 40 for r in whole) and min(r.start for r in whole) < 30
    assert draw_starts(loaded, job, 50, 7, multi_pool=True, earliest_hours=40)[0].start == 40
    with pytest.raises(
        TraceError, match=r"^a: 48 h of trace, a start after 41 h and the deadline need 49 h$"
    ):
        draw_starts(loaded, job, 1, 7, multi_pool=False, earliest_hours=41)
