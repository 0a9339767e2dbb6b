"""bench/replay.py's figures over several seeds: each run's mean and spread, each seed's totals, and the
totals of every job (the replays themselves are the e2e tests' and the bench's, not run here)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from unittest import mock

import pytest

from tests.conftest import REPO


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


with mock.patch.dict(sys.modules, {"traces": _load("bench_traces", "traces.py")}):
    replay = _load("bench_replay", "replay.py")

PAIR, ALONE = ("a_v100", "b_v100"), ("a_v100",)


def _row(cost: float | None, sim: float, met: bool = True, lost: bool = False) -> dict:
    return {
        "cost": cost,
        "sim_cost": sim,
        "met": met,
        "sim_met": True,
        "lost_committed_step": lost,
        "launches": 2,
        "sim_launches": 3,
    }


def test_seeds_are_one_or_a_list_each_once():
    assert replay.seeds("1") == [1] and replay.seeds("1,2,30") == [1, 2, 30]
    for bad in ("", "x", "1,,2", "1,1", "-1", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            replay.seeds(bad)
    for bad in ("0", "-2", "two", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            replay.positive(bad)


def test_several_seeds_give_each_runs_mean_and_spread_then_each_seeds_totals():
    results = [
        (PAIR, 1, {"rows": [_row(110.0, 100.0), _row(90.0, 100.0)]}),  # +0%
        (PAIR, 2, {"rows": [_row(130.0, 100.0), _row(130.0, 100.0, met=False)]}),  # +30%
        (ALONE, 1, {"rows": [_row(50.0, 50.0), _row(None, 50.0)]}),  # one job unpriced: +0%
        (ALONE, 2, {"rows": [_row(None, 40.0), _row(None, 40.0)]}),  # nothing priced: left out
    ]
    lines = replay.report(results, [1, 2])
    runs = {x[:40].strip(): x[40:].split() for x in lines if x[:40].strip() in ("a_v100 + b_v100", "a_v100")}
    assert runs["a_v100 + b_v100"] == ["2", "115.00", "100.00", "+15.0%", "+0.0%..+30.0%"]
    assert runs["a_v100"] == ["1", "50.00", "50.00", "+0.0%", "+0.0%..+0.0%"]  # seed 2 priced nothing
    (seed1,) = [x for x in lines if x.startswith("seed 1:")]
    assert "live mean $83.33, simulator $83.33 (+0.0%)" in seed1 and "missed 0" in seed1
    (seed2,) = [x for x in lines if x.startswith("seed 2:")]
    assert "live mean $130.00, simulator $100.00 (+30.0%)" in seed2 and "missed 1 (simulator 0)" in seed2
    assert lines[-1].startswith("all 8 jobs: live mean $102.00, simulator $90.00 (+13.3%); missed 1")
    assert "launches 16 (simulator 24)" in lines[-1]


def test_one_seed_prints_the_totals_alone_as_before():
    lines = replay.report([(PAIR, 1, {"rows": [_row(110.0, 100.0, lost=True)]})], [1])
    assert lines == [
        "\nall 1 jobs: live mean $110.00, simulator $100.00 (+10.0%); missed 0 (simulator 0); "
        "lost committed steps 1; launches 2 (simulator 3)"
    ]
    assert replay.report([(PAIR, 1, {"rows": [_row(None, 100.0)]})], [1]) == []
