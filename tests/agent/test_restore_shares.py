"""Restore reads only what each rank loads (issue 47): torch_state.restore reads straight from the store
into the ranks' state, each rank fetching the blocks of the items its load plan names, verified as they
arrive, with no local copy of the checkpoint.

The sharded jobs run as torchrun runs them (gloo on the CPU, bench/shards.py): a state of two
DTensors split by rows across the ranks. A node of a 4-node gang restores one rank's share here: the
bytes one node reads are its ranks' (each process stands for a node). Eight ranks of one machine commit
and restore together, each its eighth."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

torch = pytest.importorskip("torch")

from spotguard_agent import Agent, CheckpointStore  # noqa: E402
from spotguard_agent.agent import CANNOT_RESTORE_NOW, AgentEnv, RestoreFailed  # noqa: E402
from spotguard_agent.store_file import LocalBackend  # noqa: E402
from spotguard_agent.torch_state import restore, save  # noqa: E402

from bench.torchrun_jobs import job_env, launch, run  # noqa: E402

SHARDS = Path(__file__).resolve().parents[2] / "bench" / "shards.py"
ROWS = 512  # 2 MiB a tensor, 4 MiB of state


def _torchrun(ranks: int, *args: str) -> list[str]:
    return launch(SHARDS, ranks, *args)


def _sharded(store: Path, saved: int, restored: int) -> list[dict[str, object]]:
    env = job_env(store)
    done = run(_torchrun(saved, "save", "--rows", str(ROWS)), env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = store.parent / "report"
    report.mkdir()
    back = run(_torchrun(restored, "restore", "--rows", str(ROWS), "--report", str(report)), env)
    assert back.returncode == 0, back.stderr[-3000:]
    lines = sorted((json.loads(p.read_text()) for p in report.glob("*.json")), key=lambda r: r["rank"])
    assert len(lines) == restored and all(r["same"] for r in lines), lines
    return lines


def _metadata(store: Path) -> int:
    """The bytes every rank reads whatever its share: DCP's .metadata and the blocks files."""
    manifest = CheckpointStore(None, f"file://{store}/").read_manifest(0)
    return sum(f.size for f in manifest.files if not f.path.endswith(".distcp"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("saved", "restored"),
    [(2, 2), (2, 1), (4, 4), (8, 8)],
    ids=["2->2", "2->1", "4 nodes", "8 ranks of one machine"],
)
def test_each_rank_reads_only_the_shards_it_loads(tmp_path: Path, saved: int, restored: int):
    rows = _sharded(tmp_path / "store", saved, restored)
    total, meta = rows[0]["total"], _metadata(tmp_path / "store")
    data = total - meta  # type: ignore[operator]
    for r in rows:
        # its share of the data (each shard's torch.save framing included), plus the metadata at most
        assert r["bytes"] <= data / restored * 1.02 + meta, (r, total, meta)
        assert r["bytes"] >= data / restored * 0.98, (r, total, meta)
    assert sum(r["bytes"] for r in rows) <= data * 1.02 + restored * meta  # type: ignore[misc]


def _agent(store: Path, **env: str) -> Agent:
    settings = AgentEnv.load({"SPOTGUARD_CHECKPOINT_URI": f"file://{store}/", **env})
    return Agent(
        settings, CheckpointStore(None, settings.checkpoint_uri, retry_pause=0.01), install_signals=False
    )


def _state(seed: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(1024, 1024, generator=g), "b": torch.randn(1024, generator=g)},
        "step": seed,
    }


def test_one_process_reads_the_whole_checkpoint_once_and_nothing_more(tmp_path: Path):
    save(_agent(tmp_path), 1, 0.5, _state(1), sync=True)
    agent = _agent(tmp_path)
    got = restore(agent)
    assert got is not None and got["step"] == 1 and torch.equal(got["model"]["w"], _state(1)["model"]["w"])
    assert agent.restore_counts.bytes == agent.restored.total_bytes  # every file once, metadata included


def test_a_damaged_block_is_found_as_it_arrives_and_the_previous_checkpoint_restored(tmp_path: Path):
    save(_agent(tmp_path), 1, 0.25, _state(1), sync=True)
    save(_agent(tmp_path), 2, 0.5, _state(2), sync=True)
    newest = tmp_path / "checkpoints" / "0000000001"
    data = max(newest.glob("*.distcp"), key=lambda p: p.stat().st_size)
    with data.open("r+b") as f:  # one byte in the middle of the largest file: its size still matches
        f.seek(data.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    agent = _agent(tmp_path)
    got = restore(agent)
    assert got is not None and got["step"] == 1
    assert agent.store.passed_over == {1: "damaged"} and agent.store.restored == 0


def test_a_store_that_cannot_be_read_now_ends_the_restore_with_69_rather_than_start_fresh(
    tmp_path, monkeypatch
):
    save(_agent(tmp_path), 1, 0.5, _state(1), sync=True)
    calls = []
    real = LocalBackend.read_range

    def throttled(self: LocalBackend, key: str, start: int, into: list[memoryview]) -> int:
        if not key.endswith(".distcp"):  # the metadata and blocks read; the data throttled
            return real(self, key, start, into)
        calls.append(key)
        raise ClientError(
            {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject"
        )

    monkeypatch.setattr(LocalBackend, "read_range", throttled)
    monkeypatch.setattr("spotguard_agent.dcp_reader.RUN_PAUSE", 0.0)
    with pytest.raises(RestoreFailed) as raised:
        restore(_agent(tmp_path))
    assert raised.value.code == CANNOT_RESTORE_NOW and "3 tries" in raised.value.reason
    # each ranged read tried 3 times, the whole checkpoint 3 times, and no fall-back to a fresh start
    assert len(calls) >= 9 and len(calls) % 3 == 0


def test_a_read_that_fails_once_is_tried_again_alone(tmp_path, monkeypatch):
    save(_agent(tmp_path), 1, 0.5, _state(1), sync=True)
    real, failed = LocalBackend.read_range, []

    def once(self: LocalBackend, key: str, start: int, into: list[memoryview]) -> int:
        if key.endswith(".distcp") and not failed:
            failed.append(key)
            raise ClientError(
                {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "Get"
            )
        return real(self, key, start, into)

    monkeypatch.setattr(LocalBackend, "read_range", once)
    monkeypatch.setattr("spotguard_agent.dcp_reader.RUN_PAUSE", 0.0)
    agent = _agent(tmp_path)
    assert restore(agent) is not None and failed
    assert agent.restore_counts.bytes == agent.restored.total_bytes  # nothing read twice but that one


def test_a_rank_reads_only_the_items_it_loads_of_a_file_that_holds_others(tmp_path: Path):
    """One file, three tensors: loading one reads its blocks (and the metadata), not the file."""
    import torch.distributed.checkpoint as dcp  # noqa: F401
    from spotguard_agent.dcp_reader import StoreReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state = {"a": torch.randn(256, 1024), "b": torch.randn(512, 1024), "c": torch.randn(256, 1024)}
    agent = _agent(tmp_path, SPOTGUARD_WRITE_THREADS="1")
    save(agent, 1, 0.5, state, sync=True)
    store = CheckpointStore(None, f"file://{tmp_path}/")
    manifest = store.read_manifest(0)
    assert sum(f.path.endswith(".distcp") for f in manifest.files) == 1  # every tensor in one file
    reader = StoreReader(store, manifest)
    out: dict[str, object] = {}
    _load_state_dict(
        out, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(keys={"t:b"}), no_dist=True
    )
    assert torch.equal(out["t:b"], state["b"])  # type: ignore[arg-type]
    small = sum(f.size for f in manifest.files if not f.path.endswith(".distcp"))
    assert 2 * 1024**2 <= reader.counts.bytes <= 2 * 1024**2 + small + 4096, reader.counts


def test_another_jobs_checkpoint_is_passed_over(tmp_path: Path):
    save(_agent(tmp_path, SPOTGUARD_JOB_ID="mine"), 1, 0.5, _state(1), sync=True)
    save(_agent(tmp_path, SPOTGUARD_JOB_ID="theirs"), 2, 0.5, _state(2), sync=True)
    agent = _agent(tmp_path, SPOTGUARD_JOB_ID="mine")
    got = restore(agent)
    assert got is not None and got["step"] == 1 and agent.store.restored == 0


def test_a_fresh_start_is_none(tmp_path: Path):
    agent = _agent(tmp_path)
    assert restore(agent) is None and agent.restored is None


def test_a_checkpoint_of_an_earlier_agent_without_blocks_still_restores(tmp_path: Path):
    """Written as agents before blocks wrote it: the same files, no blocks file, no `blocks` named."""
    save(_agent(tmp_path), 1, 0.5, _state(1), sync=True)
    store = CheckpointStore(None, f"file://{tmp_path}/")
    old = store.read_manifest(0)
    files = tuple(
        f.model_copy(update={"blocks": None}) for f in old.files if not f.path.startswith("blocks.")
    )
    (tmp_path / "checkpoints" / "0000000000" / "MANIFEST.json").write_text(
        old.model_copy(update={"files": files}).model_dump_json(exclude_none=True)
    )
    got = restore(_agent(tmp_path))
    assert got is not None and torch.equal(got["model"]["b"], _state(1)["model"]["b"])


@pytest.mark.slow  # a process of its own, which imports torch
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a small tmpfs needs root"
)
def test_restore_needs_no_disk_the_size_of_the_checkpoint(tmp_path: Path):
    """The restoring process's working and temporary directory is a 1 MiB file system; the checkpoint is
    4 MiB. A restore that copied the checkpoint to a disk first could not."""
    store = tmp_path / "store"
    save(_agent(store), 1, 0.5, _state(1), sync=True)
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=False).returncode:
        pytest.skip("this machine does not let a test mount a tmpfs")
    try:
        code = (
            "from spotguard_agent import Agent; from spotguard_agent.torch_state import restore; "
            "print(restore(Agent.from_env())['step'])"
        )
        env = {**job_env(store), "TMPDIR": str(small), "SPOTGUARD_JOB_ID": "local"}
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=small, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0 and done.stdout.split() == ["1"], done.stderr[-2000:]
        assert CheckpointStore(None, f"file://{store}/").read_manifest(0).total_bytes > 4 * 1024 * 1024
    finally:
        subprocess.run(["umount", str(small)], check=False)


@pytest.mark.slow
def test_damage_in_one_ranks_shard_sends_every_rank_to_the_previous_checkpoint(tmp_path: Path):
    """Only rank 1 reads the damaged block; both ranks must restore the same, previous checkpoint (and
    neither may hang in a collective the other skipped)."""
    store = tmp_path / "store"
    env = job_env(store)
    for _ in range(2):
        done = run(_torchrun(2, "save", "--rows", str(ROWS)), env)
        assert done.returncode == 0, done.stderr[-3000:]
    newest = store / "checkpoints" / "0000000001"
    data = max(newest.glob("__1_*.distcp"), key=lambda p: p.stat().st_size)
    with data.open("r+b") as f:
        f.seek(data.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    report = tmp_path / "report"
    report.mkdir()
    back = run(_torchrun(2, "restore", "--rows", str(ROWS), "--report", str(report)), env)
    assert back.returncode == 0, back.stderr[-3000:]
    rows = [json.loads(p.read_text()) for p in sorted(report.glob("*.json"))]
    assert [r["sequence"] for r in rows] == [0, 0] and all(r["same"] for r in rows), rows
    assert "checkpoint 1 is damaged" in back.stderr
