"""`spotguard jobs logs` and `jobs status --plot` on the status answer the deployed jobs function really
gives (the stack in moto), after an interruption and a resubmission from a checkpoint."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from spotguard_cli import jobs as jobs_cli
from spotguard_cli.emulator.world import JobsWorld
from spotguard_cli.main import build_parser
from spotguard_cli.timeline_plot import plot_job


@pytest.mark.slow  # deploys the stack into moto
def test_logs_and_plot_read_the_real_status_answer(jobs: JobsWorld, tmp_path: Path):
    job = jobs.submit(gpus=1)
    arn1 = job["task_arn"]
    jobs.emit(arn1)  # RUNNING
    jobs.commit_checkpoint(job, 1)
    jobs.commit_checkpoint(job, 2)
    jobs.interrupt(jobs.hosts["a1"])
    jobs.emit(arn1, exit_code=75)
    status = jobs.status(job["job_id"])
    assert len(status["attempts"]) == 2

    out = io.StringIO()
    args = build_parser().parse_args(["jobs", "logs", job["job_id"]])
    assert jobs_cli.run(args, invoke=jobs.invoke, out=out) == 0
    lines = out.getvalue().splitlines()
    # the emulator's task definition logs nowhere: each attempt says so, and the line between them
    # says what stopped the first and where the second resumed
    assert lines[0].startswith("--- attempt 1: task ") and "from scratch" in lines[0]
    assert lines[1].startswith("attempt 1: no container of train") and "awslogs" in lines[1]
    assert lines[2].startswith("--- attempt 1 stopped at ")
    assert "interrupted: spot-interruption on " in lines[2] and "exit train=75" in lines[2]
    assert lines[2].endswith("resumed from checkpoint #2 (step 200, 20%)")
    assert lines[3].startswith("attempt 2: no container of train")
    assert lines[4].startswith(f"--- job {job['job_id']} is running")

    answer = jobs.invoke({"action": "status", "job_id": job["job_id"]})
    drawn = plot_job(answer, str(tmp_path / "t.png"))
    assert [b.attempt for b in drawn.bars] == [1, 2] and len(drawn.interruptions) == 1
    assert len(drawn.checkpoints) == 2
