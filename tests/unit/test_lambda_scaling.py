"""Lambda's SQS scaling as the local stack plays it (`Scaling`), its schedule for invocations timed one at
a time (bench/local_load.py --isolated), and the latency model's draws."""

from __future__ import annotations

import random
import statistics

import pytest

from spotguard_cli.emulator.latency import Latency, LatencyModel
from spotguard_cli.emulator.scaling import Scaling


def test_five_batches_at_first_then_five_more_a_second_up_to_the_limit() -> None:
    s = Scaling()
    assert [s.allowed(t) for t in (0.0, 0.1, 0.2, 1.0, 3.0)] == [5, 5, 6, 10, 20]
    assert s.allowed(3 * s.step_seconds) == 8  # a whole number of steps is not lost to rounding
    assert Scaling(limit=7).allowed(60.0) == 7


def test_twenty_batches_at_once_begin_as_the_allowance_grows_and_new_environments_start_cold() -> None:
    placed = Scaling().schedule([0.0] * 20, [10.0] * 20, cold_seconds=0.5)
    starts = [round(t, 6) for t, _ in placed]
    assert starts == [0.0] * 5 + [round(0.2 * k, 6) for k in range(1, 16)]
    assert all(cold for _, cold in placed)


def test_an_ended_invocation_leaves_a_warm_environment_for_the_next_batch() -> None:
    placed = Scaling(limit=1).schedule([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], cold_seconds=0.5)
    assert placed == [(0.0, True), (1.5, False), (2.5, False)]


def test_a_batch_begins_when_its_records_are_ready_and_never_before_the_one_received_before_it() -> None:
    placed = Scaling().schedule([0.0, 2.0, 1.0], [0.1, 0.1, 0.1], cold_seconds=0.0)
    assert [t for t, _ in placed] == [0.0, 2.0, 2.0]
    assert [cold for _, cold in placed] == [True, False, True]  # the first one's environment, then a new one


def test_a_schedule_needs_one_duration_per_batch() -> None:
    assert Scaling().schedule([], [], cold_seconds=1.0) == []
    with pytest.raises(ValueError):
        Scaling().schedule([0.0, 0.0], [1.0], cold_seconds=0.0)


def test_a_latency_draws_its_median_and_99th_percentile() -> None:
    rng = random.Random(7)
    draws = sorted(Latency(60, 250).draw(rng) for _ in range(20000))
    assert statistics.median(draws) == pytest.approx(0.060, rel=0.05)
    assert draws[int(0.99 * len(draws))] == pytest.approx(0.250, rel=0.1)


def test_an_events_way_to_the_poller_is_eventbridge_then_the_receive() -> None:
    model = LatencyModel(seed=3)
    draws = sorted(model.delivery() for _ in range(5000))
    assert 0.04 < statistics.median(draws) < 0.08  # 40 ms (EventBridge) + 15 ms (SQS), medians
    assert draws[0] > 0
