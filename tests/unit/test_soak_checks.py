"""The soak's checks can fail: two attempts of one job alive at once are found, one after the other are
not (spotguard_cli.emulator.soak; the whole soak: tests/e2e/test_soak.py)."""

from __future__ import annotations

from datetime import timedelta

from spotguard_cli.emulator.soak.model import START, Task, alive_at_once


def _task(job: str, attempt: int, placed_min: int, exited_min: int | None) -> Task:
    exited = START + timedelta(minutes=exited_min) if exited_min is not None else None
    return Task(
        f"arn-{job}-{attempt}", job, attempt, "ci", START + timedelta(minutes=placed_min), 0, exited_at=exited
    )


def test_attempts_one_after_the_other_are_fine_and_overlapping_ones_are_found():
    end = START + timedelta(hours=5)
    fine = [_task("a", 1, 0, 60), _task("a", 2, 60, None), _task("b", 1, 10, None)]
    assert alive_at_once(fine, end) == []
    overlapping = [_task("a", 1, 0, 60), _task("a", 2, 59, None)]
    (found,) = alive_at_once(overlapping, end)
    assert found.startswith("a: attempt 2 placed at")
    still_alive = [_task("a", 1, 0, None), _task("a", 2, 120, None)]
    assert len(alive_at_once(still_alive, end)) == 1


def test_two_tasks_of_one_attempt_alive_at_once_are_found_too():
    end = START + timedelta(hours=5)
    first, second = _task("a", 1, 0, 30), _task("a", 1, 10, None)
    second.arn = "arn-a-1-again"
    (found,) = alive_at_once([first, second], end)
    assert found.startswith("a: a second task of 1 placed at")
    second.placed_at = START + timedelta(minutes=30)  # the first had exited: fine
    assert alive_at_once([first, second], end) == []
