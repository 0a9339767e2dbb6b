"""The agent in every rank of a torchrun job (2 ranks, gloo, CPU), run as SpotGuard runs it:
`spotguard-agent run -- torchrun ...` as the container's first process, signalled as ECS signals it.
Checkpoints in a file:// store (the same code path as S3 but the upload)."""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from spotguard_agent import CheckpointStore  # noqa: E402

from bench.torchrun_jobs import (  # noqa: E402
    DDP,
    EXIT_RE,
    FSDP,
    STEPS,
    job_env,
    run,
    same_weights,
    signalled,
    torchrun,
    wrapped,
)

pytestmark = pytest.mark.slow  # every test runs torchrun and its ranks as processes

DIES = Path(__file__).with_name("rank_dies.py")


def _store(path: Path) -> CheckpointStore:
    return CheckpointStore(None, f"file://{path}/")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The weights of an uninterrupted 2-rank run."""
    d = tmp_path_factory.mktemp("reference")
    out = d / "final.pt"
    done = run(torchrun(DDP, 2, out), job_env(d / "store"))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_sigterm_to_the_wrapper_commits_one_checkpoint_of_both_ranks_exits_75_and_resumes_on_2_or_1(
    tmp_path, reference
):
    store = tmp_path / "store"
    env = job_env(store)
    code, out, err = signalled(
        wrapped(torchrun(DDP, 2, tmp_path / "a.pt", "--step-seconds", "0.05")), env, 5, signal.SIGTERM
    )  # as ECS StopTask does, to the container's first process
    assert code == 75, err[-3000:]
    stopped = int(EXIT_RE.search(out)[1])  # type: ignore[index]
    assert 5 <= stopped < STEPS
    s = _store(store)
    assert s.committed() == [0]  # one checkpoint, not one per rank
    manifest = s.read_manifest(0)
    assert manifest.step == stopped and manifest.job_id == "j-ranks"
    names = {f.path for f in manifest.files}
    assert ".metadata" in names
    assert {n.split("_")[2] for n in names if n.startswith("__")} == {"0", "1"}  # both ranks' files
    assert "stopped on committed checkpoint 0" in err

    # resumed on 1 rank (8 GPUs to 4: here 2 ranks to 1), from a copy of the store as it is now
    one = tmp_path / "one"
    shutil.copytree(store, one)
    single = run(wrapped(torchrun(DDP, 1, tmp_path / "c.pt")), job_env(one))
    assert single.returncode == 0, single.stderr[-3000:]
    assert f"resumed after step {stopped} on 1 rank(s)" in single.stdout
    assert f"step {stopped + 1} loss" in single.stdout and "finished" in single.stdout

    # resumed on 2 ranks: bit-identical to the uninterrupted run
    again = run(wrapped(torchrun(DDP, 2, tmp_path / "b.pt")), env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed after step {stopped} on 2 rank(s)" in again.stdout
    assert same_weights(tmp_path / "b.pt", reference)


def test_sigusr1_to_the_wrapper_makes_every_rank_checkpoint_and_go_on(tmp_path, reference):
    store = tmp_path / "store"
    code, out, err = signalled(
        wrapped(torchrun(DDP, 2, tmp_path / "a.pt", "--step-seconds", "0.05")),
        job_env(store),
        5,
        signal.SIGUSR1,
    )  # as SpotGuard does on a rebalance recommendation
    assert code == 0, err[-3000:]
    assert "finished" in out
    s = _store(store)
    assert s.committed() == [0]
    manifest = s.read_manifest(0)
    assert 5 <= manifest.step < STEPS - 1
    assert {n.path.split("_")[2] for n in manifest.files if n.path.startswith("__")} == {"0", "1"}
    assert same_weights(tmp_path / "a.pt", reference)  # the checkpoint changed nothing


def test_a_rank_killed_mid_commit_leaves_no_manifest_and_the_previous_checkpoint_is_restored(
    tmp_path, reference
):
    store = tmp_path / "store"
    env = job_env(store, DIE_RANK="1", DIE_AT_SEQUENCE="1")
    died = run(torchrun(DIES, 2, tmp_path / "a.pt", "--save-every", "10"), env)
    assert died.returncode not in (0, 75), died.stdout[-2000:]
    s = _store(store)
    assert s.committed() == [0]  # checkpoint 1 was begun (its files are there) but has no manifest
    begun = store / "checkpoints" / "0000000001"
    assert begun.is_dir() and any(p.name.startswith("__1_") for p in begun.iterdir())
    assert not (begun / "MANIFEST.json").exists()
    resumed = run(wrapped(torchrun(DDP, 2, tmp_path / "b.pt")), job_env(store))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed after step 9 on 2 rank(s)" in resumed.stdout
    assert same_weights(tmp_path / "b.pt", reference)


def test_a_rank_whose_writes_fail_is_the_one_named_and_nothing_is_committed(tmp_path):
    """DCP tells every rank alike that one failed: the rank whose disk was full is the one said, not
    rank 0 that failed only because of it."""
    store = tmp_path / "store"
    env = job_env(store, DIE_RANK="1", DIE_AT_SEQUENCE="1", DIE_HOW="disk-full")
    failed = run(torchrun(DIES, 2, tmp_path / "a.pt", "--save-every", "10"), env)
    assert failed.returncode not in (0, 75), failed.stdout[-2000:]
    said = re.findall(r"checkpoint 1 not committed: (rank \d+: \w+)", failed.stderr)
    assert said and set(said) == {"rank 1: OSError"}, failed.stderr[-3000:]
    assert "No space left on device" in failed.stderr and "OtherRankFailed" not in failed.stderr
    assert _store(store).committed() == [0]


def test_a_stop_checkpoint_that_cannot_fit_its_budget_is_said_and_the_last_committed_one_kept(tmp_path):
    store = tmp_path / "store"
    env = job_env(store, SPOTGUARD_STOP_TIMEOUT_SECONDS="0.01")  # no commit can fit in it
    code, out, err = signalled(
        wrapped(torchrun(DDP, 2, tmp_path / "a.pt", "--step-seconds", "0.05", "--save-every", "5")),
        env,
        12,
        signal.SIGTERM,
    )
    assert code == 75, err[-3000:]
    said = re.findall(r"not starting it; stopping on committed checkpoint (\d+) \(step (\d+)\)", err)
    assert len(said) == 1, err[-3000:]  # one line, from one rank
    sequence, step = int(said[0][0]), int(said[0][1])
    stopped = int(EXIT_RE.search(out)[1])  # type: ignore[index]
    s = _store(store)
    assert s.committed()[-1] == sequence and s.read_manifest(sequence).step == step
    assert step < stopped  # the stop step itself was not checkpointed
    assert (step + 1) % 5 == 0


def test_fsdp_shards_resume_on_another_number_of_ranks(tmp_path):
    store = tmp_path / "store"
    first = run(wrapped(torchrun(FSDP, 2, tmp_path / "a.pt", "--save-every", "10", steps=20)), job_env(store))
    assert first.returncode == 0, first.stderr[-3000:]
    manifest = _store(store).read_manifest(1)
    assert manifest.step == 19
    assert {n.path.split("_")[2] for n in manifest.files if n.path.startswith("__")} == {"0", "1"}
    single = run(wrapped(torchrun(FSDP, 1, tmp_path / "b.pt", steps=24)), job_env(store))
    assert single.returncode == 0, single.stderr[-3000:]
    assert "resumed after step 19 on 1 rank(s)" in single.stdout and "finished" in single.stdout


def test_ranks_checkpoint_to_s3_each_uploading_its_own_files(tmp_path, moto_server, s3, bucket):
    env = job_env(tmp_path, AWS_ENDPOINT_URL=moto_server.endpoint, AWS_ACCESS_KEY_ID="testing")
    env.update(AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    env["SPOTGUARD_CHECKPOINT_URI"] = f"s3://{bucket}/jobs/ranks/"
    first = run(wrapped(torchrun(DDP, 2, tmp_path / "a.pt", "--save-every", "10", steps=20)), env)
    assert first.returncode == 0, first.stderr[-3000:]
    store = CheckpointStore(s3, env["SPOTGUARD_CHECKPOINT_URI"])
    assert store.committed() == [0, 1]
    files = {f.path for f in store.read_manifest(1).files}
    assert ".metadata" in files and {n.split("_")[2] for n in files if n.startswith("__")} == {"0", "1"}
    single = run(wrapped(torchrun(DDP, 1, tmp_path / "b.pt", steps=22)), env)
    assert single.returncode == 0, single.stderr[-3000:]
    assert "resumed after step 19 on 1 rank(s)" in single.stdout
