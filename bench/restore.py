"""The restore side of bench/checkpoint.py (`bench/checkpoint.py --restore`, issue 47): a training state
of --sizes GiB (the save benchmark's: fp32 parameters and AdamW's two moments in 1,152 tensors) is
committed, then read back by torch_state.restore straight from the store into memory, beside the
machine's own parallel read of the same bytes in the same run:
- from a file:// store: the checkpoint's files read whole by as many threads as the restore keeps reads
  in flight (`cat` of the files in parallel, into memory);
- from S3 (moto server on 127.0.0.1): the same objects in plain ranged GETs of 16 MiB with the same
  concurrency.
Goal: the restore at least 0.8 x that read. Only ratios within one run mean anything on a shared machine;
moto serves from memory, so the S3 figures measure the client side more than a network.

A gang's share: a 4-node job (4 ranks here, one a node) commits a state sharded across its ranks
(bench/shards.py, gloo on the CPU) and restores it; each node's bytes read are printed beside the
checkpoint's (goal: at most a quarter, plus the metadata).

Then the time a job waits after an interruption: a new process (python, torch, the agent) restores the
file:// checkpoint and takes one step; the agent's own line gives its start -> first step, and the
restore's share. Goal: at most the restore's time + 5 s.

    .venv/bin/python bench/checkpoint.py --restore [--sizes 1] [--dir /local/disk]
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from spotguard_agent import Agent, CheckpointStore
from spotguard_agent.agent import AgentEnv
from spotguard_agent.dcp_files import BLOCK
from spotguard_agent.store_s3 import transfer_for
from spotguard_agent.torch_state import restore, save

CONCURRENCY = 16  # reads in flight, the restore's and the plain read's alike


def _agent(uri: str, client: Any = None) -> Agent:
    env = AgentEnv.load({"SPOTGUARD_CHECKPOINT_URI": uri, "SPOTGUARD_S3_CONCURRENCY": str(CONCURRENCY)})
    store = CheckpointStore(client, uri, transfer=transfer_for(CONCURRENCY, 1))
    return Agent(env, store, install_signals=False)


def _timed_restore(uri: str, client: Any = None) -> tuple[float, int]:
    agent = _agent(uri, client)
    started = time.perf_counter()
    state = restore(agent)
    seconds = time.perf_counter() - started
    assert state is not None and agent.restore_counts is not None
    read = agent.restore_counts.bytes
    del state
    gc.collect()
    return seconds, read


def _parallel_cat(directory: Path, checked: bool = False) -> float:
    """Every file of the checkpoint read whole into memory, CONCURRENCY files at a time; `checked`: and
    a CRC32 taken of every block of BLOCK bytes, in the same threads (what a verified read costs)."""
    files = [p for p in directory.iterdir() if p.is_file()]

    def read(p: Path) -> int:
        data = p.read_bytes()
        if checked:
            view = memoryview(data)
            for at in range(0, len(view), BLOCK):
                zlib.crc32(view[at : at + BLOCK])
        return len(data)

    started = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(read, files))
    return time.perf_counter() - started


def _parallel_gets(client: Any, bucket: str, keys: list[tuple[str, int]]) -> float:
    """The same objects in plain ranged GETs of one block each, CONCURRENCY in flight."""
    ranges = [(k, s, min(BLOCK, size - s)) for k, size in keys for s in range(0, size, BLOCK)]

    def get(r: tuple[str, int, int]) -> int:
        key, start, n = r
        answer = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{start + n - 1}")
        return len(answer["Body"].read())

    started = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(get, ranges))
    return time.perf_counter() - started


def into_device(uri: str, state: Any, device: Any, block: Any, nbytes: int) -> tuple[float, float]:
    """(seconds, GB/s of one pinned host -> device copy): the checkpoint at `uri` restored into a state
    shaped as `state` on `device` (torch_state.restore with `into`: each item read, checked, and copied
    into its tensor there; the page cache warm, the files just written), beside one pinned, non-blocking
    copy of as many bytes from host memory (`block`, pinned) to the device, best of 3."""
    import torch

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    template = _like(state)
    agent = _agent(uri)
    sync()
    started = time.perf_counter()
    got = restore(agent, into=template)
    sync()
    seconds = time.perf_counter() - started
    assert got is not None
    dst, best = torch.empty(nbytes, dtype=torch.uint8, device=device), float("inf")
    for _ in range(3):
        sync()
        started = time.perf_counter()
        dst.copy_(block[:nbytes], non_blocking=True)
        sync()
        best = min(best, time.perf_counter() - started)
    del dst, template, got
    gc.collect()
    return seconds, nbytes / best / 1e9


def _like(value: Any) -> Any:
    """`value` with every tensor an empty one of its shape, dtype and device (a job's state before it
    restores)."""
    import torch

    if isinstance(value, torch.Tensor):
        return torch.empty_like(value)
    if isinstance(value, dict):
        return {k: _like(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_like(v) for v in value)
    return value


def tensors(value: object) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors(v)]
    return []


RESUMED = """
import torch
from spotguard_agent import Agent
from spotguard_agent.torch_state import restore
agent = Agent.from_env()
state = restore(agent)
assert state is not None
loss = sum(float(t.flatten()[0]) for t in state["model"].values())  # one step's worth of work
agent.should_save()  # the step boundary: the agent says how long the process took to get here
"""


def first_step(uri: str) -> tuple[float, float]:
    """(start -> first step, the restore's share) of a new process resuming from `uri`, in seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTGUARD_")}
    env.update(
        SPOTGUARD_CHECKPOINT_URI=uri, SPOTGUARD_WATCH_METADATA="false", AWS_EC2_METADATA_DISABLED="true"
    )
    done = subprocess.run(
        [sys.executable, "-c", RESUMED], env=env, capture_output=True, text=True, check=True
    )
    # the agent's line, read as `spotguard local run` reads it (the CLI: not on a bare GPU machine, where
    # bench/gpu.sh imports this module for into_device)
    from spotguard_cli.local.shared import first_step as said_first_step

    found = said_first_step(done.stderr)
    assert found, done.stderr[-2000:]
    return found


def run(
    sizes: list[float], make_state: Callable[[float], Any], root: Path, client: Any = None, bucket: str = ""
) -> list[dict[str, float]]:
    """For each size: `make_state(gib)` committed and restored (see the module's doc)."""
    rows = []
    for gib in sizes:
        state = make_state(gib)
        local = f"file://{tempfile.mkdtemp(prefix='restore-', dir=root)}/"
        save(_agent(local), 1, 0.5, state, sync=True)
        row: dict[str, float] = {"gib": gib}
        directory = Path(local.removeprefix("file://")) / "checkpoints" / "0000000000"
        _parallel_cat(directory)  # the page cache warm for both, as a restarted task on the same disk
        row["file_cat_s"] = _parallel_cat(directory)
        row["file_cat_crc_s"] = _parallel_cat(directory, checked=True)
        row["file_restore_s"], row["file_read_bytes"] = _timed_restore(local)
        row["bytes"] = sum(p.stat().st_size for p in directory.iterdir())
        row["first_step_s"], row["first_restore_s"] = first_step(local)
        if client is not None:
            prefix = f"s3://{bucket}/{os.path.basename(local.rstrip('/'))}/"
            agent = _agent(prefix, client)
            save(agent, 1, 0.5, state, sync=True)
            manifest = agent.store.read_manifest(0)
            keys = [(agent.store.location.key(0, f.path), f.size) for f in manifest.files]
            row["s3_gets_s"] = _parallel_gets(client, bucket, keys)
            row["s3_restore_s"], row["s3_read_bytes"] = _timed_restore(prefix, client)
        del state
        gc.collect()
        rows.append(row)
    return rows


def gang_share(root: Path, nodes: int = 4, rows: int = 4096) -> list[dict[str, Any]]:
    """Each node's read of a `nodes`-node checkpoint (bench/shards.py: two DTensors of `rows` x 4 KiB),
    restored by a gang of the same size: [{rank, bytes, total}, ...]."""
    import json

    from torchrun_jobs import job_env, launch, run  # bench/, beside this script

    shards = Path(__file__).with_name("shards.py")
    store, report = Path(tempfile.mkdtemp(dir=root)), Path(tempfile.mkdtemp(dir=root))
    env = job_env(store)
    for args in (("save",), ("restore", "--report", str(report))):
        done = run(launch(shards, nodes, *args, "--rows", str(rows)), env)
        assert done.returncode == 0, done.stderr[-2000:]
    return sorted((json.loads(p.read_text()) for p in report.glob("*.json")), key=lambda r: r["rank"])


def report_gang(rows: list[dict[str, Any]]) -> None:
    total = rows[0]["total"]
    print(f"a {len(rows)}-node gang's checkpoint ({total / 1024**2:.1f} MiB), each node restoring its share:")
    for r in rows:
        share = r["bytes"] / total
        print(f"  node {r['rank']}: read {r['bytes'] / 1024**2:6.2f} MiB, {share:.3f} of the checkpoint")


def report(rows: list[dict[str, float]]) -> None:
    print(f"restore straight into memory, {CONCURRENCY} reads in flight (torch_state.restore):")
    for r in rows:
        gb = r["bytes"] / 1e9
        print(f"  {r['gib']:g} GiB state ({r['bytes'] / 1024**3:.2f} GiB of files):")
        cat, rest = r["file_cat_s"], r["file_restore_s"]
        print(
            f"    file://  restore {rest:6.2f} s ({gb / rest:5.2f} GB/s)   parallel cat {cat:6.2f} s"
            f" ({gb / cat:5.2f} GB/s)   restore x{cat / rest:.2f} of the read"
            f"   read {r['file_read_bytes']:,} B"
        )
        checked = r["file_cat_crc_s"]
        print(
            f"             the same read with a CRC32 of every block (a verified read) {checked:6.2f} s:"
            f" restore x{checked / r['file_restore_s']:.2f} of it"
        )
        first, rest = r["first_step_s"], r["first_restore_s"]
        print(
            f"    a new process resuming from file://: start -> first step {first:6.2f} s, the restore"
            f" {rest:.2f} s of it (goal, the restore + 5 s: {'met' if first <= rest + 5 else 'NOT met'})"
        )
        if "s3_restore_s" in r:
            gets, rest = r["s3_gets_s"], r["s3_restore_s"]
            print(
                f"    S3       restore {rest:6.2f} s ({gb / rest:5.2f} GB/s)   ranged GETs  {gets:6.2f} s"
                f" ({gb / gets:5.2f} GB/s)   restore x{gets / rest:.2f} of the read"
                f"   read {r['s3_read_bytes']:,} B"
            )
