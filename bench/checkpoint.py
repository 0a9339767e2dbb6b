"""Benchmark of the agent's checkpoints against moto server S3 on 127.0.0.1.

1. Training-step stall: the wall time of a training step that checkpoints (async: the in-memory copy,
   the rest in the background; sync: copy, write and upload) against a step that does not.
2. Commit time of a 1 GiB checkpoint (4 files of 256 MiB) through the agent (transfer manager, parallel
   multipart, manifest last) against the same bytes sent as a single plain put_object.
2b. The stop checkpoint of a --gib GiB training state (1,152 tensors) streamed to S3 as it is written,
   against the same files written, hashed and fsynced into a local directory, then uploaded.

Only ratios within one run mean anything on a shared machine; moto keeps objects in memory, so the
figures measure the client side (hashing, parallelism) more than a network.

    .venv/bin/python bench/checkpoint.py [--gib 1] [--state-mib 256]

GPU mode (`--gpu`, the default when CUDA is there; `--hardware` runs the same on the CPU), for training
states of --sizes GiB (default 1 and 13.5: 1.2 B fp32 parameters with AdamW's two moments, in 1,152
tensors), to a file:// store under --dir:
3. the snapshot (torch_state's copy into reused pinned host buffers) in GB/s beside one pinned,
   non-blocking copy of the same bytes in the same run, and the stall it costs the training loop;
4. the SIGTERM commit (torch_state.save after a stop: snapshot, parallel writes hashed as written,
   fsync, manifest) in seconds beside the same bytes written, hashed and fsynced by as many parallel
   writers doing nothing else (the machine's own limit), and the commit's share of a 120 s warning;
5. the restore of that checkpoint into a state of the same shapes on the device (torch_state.restore
   with `into`), beside one pinned, non-blocking copy of the same bytes from host to device.

    python bench/checkpoint.py --gpu [--sizes 1,13.5] [--dir /local/disk]

Restore mode (`--restore`, bench/restore.py): the state committed, then restored straight from a file://
store and from moto server S3 into memory, beside a parallel read of the same bytes in the same run.

    .venv/bin/python bench/checkpoint.py --restore [--sizes 1]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import torch
from restore import into_device, tensors  # bench/, beside this script
from spotguard_agent import Agent, AgentEnv, CheckpointStore
from spotguard_agent.ranks import Ranks
from spotguard_agent.snapshot import HostBuffers, writable
from spotguard_agent.store_s3 import transfer_for
from spotguard_agent.torch_state import HashingFileSystem, _threads, save
from torch import nn


def model_of(mib: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    width = 2048
    layers = max(1, mib * 1024 * 1024 // (4 * width * width * 2))  # weights + momentum
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    return model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.randn(32, 2048)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def stall(s3: object, bucket: str, state_mib: int, repeat: int) -> dict[str, float]:
    model, opt = model_of(state_mib)
    env = AgentEnv.model_validate({"SPOTGUARD_CHECKPOINT_URI": f"s3://{bucket}/stall/{uuid.uuid4().hex}/"})
    agent = Agent(env, CheckpointStore(s3, env.checkpoint_uri, keep=2), install_signals=False)
    for _ in range(3):
        step(model, opt)  # warm up
    out: dict[str, list[float]] = {"plain": [], "async": [], "sync": []}
    for _ in range(repeat):
        for kind in ("plain", "async", "sync"):
            agent.wait()
            t = time.perf_counter()
            step(model, opt)
            state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
            if kind != "plain":
                save(agent, 1, 0.5, state, sync=kind == "sync")
            out[kind].append(time.perf_counter() - t)
    agent.close()
    return {k: statistics.median(v) for k, v in out.items()}


def commit_vs_put(s3: object, bucket: str, gib: float) -> dict[str, float]:
    total = int(gib * 1024**3)
    files = 4
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d) / "ckpt"
        directory.mkdir()
        chunk = os.urandom(64 * 1024 * 1024)
        for i in range(files):
            with (directory / f"shard-{i}.bin").open("wb") as f:
                for _ in range(total // files // len(chunk)):
                    f.write(chunk)
        store = CheckpointStore(s3, f"s3://{bucket}/big/{uuid.uuid4().hex}/", keep=1)
        t = time.perf_counter()
        store.commit(directory, step=1, progress=0.5)
        agent_s = time.perf_counter() - t
        blob = b"".join((directory / f"shard-{i}.bin").read_bytes() for i in range(files))
        t = time.perf_counter()
        s3.put_object(Bucket=bucket, Key=f"plain/{uuid.uuid4().hex}", Body=blob)  # type: ignore[attr-defined]
        put_s = time.perf_counter() - t
    return {"bytes": float(total), "agent_commit_s": agent_s, "single_put_s": put_s}


def stop_commit_to_s3(s3: object, bucket: str, gib: float) -> dict[str, float]:
    """The stop checkpoint of a `gib` GiB training state to S3: streamed up as it is written (the agent)
    against the same DCP files written, hashed and fsynced into a local directory first and then
    uploaded (the agent's path before: a second pass through a disk)."""
    state = training_state(gib, torch.device("cpu"))
    nbytes = sum(v.numel() * v.element_size() for v in tensors(state))
    env = AgentEnv.model_validate({"SPOTGUARD_CHECKPOINT_URI": f"s3://{bucket}/stop/{uuid.uuid4().hex}/"})
    store = CheckpointStore(s3, env.checkpoint_uri, keep=1, transfer=transfer_for(0, 1))
    agent = Agent(env, store, install_signals=False, ranks=Ranks())
    agent.host_buffers = HostBuffers()
    agent.host_buffers.take(state)  # made before, as a running job's agent has them
    agent.request_stop()
    t = time.perf_counter()
    save(agent, 1, 0.5, state)
    streamed = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as d:
        import torch.distributed.checkpoint as dcp

        t = time.perf_counter()
        payload = {f"t{i}": v for i, v in enumerate(tensors(agent.host_buffers.take(state)))}
        fs = HashingFileSystem()
        writer = dcp.FileSystemWriter(d, thread_count=_threads(agent), sync_files=True, overwrite=True)
        writer.fs = fs
        dcp.save(payload, storage_writer=writer, no_dist=True)
        written = time.perf_counter() - t
        key = f"staged/{uuid.uuid4().hex}/"
        store.backend.put_files([(Path(d) / e.path, key + e.path) for e in fs.entries()])
        staged = time.perf_counter() - t
    return {"bytes": float(nbytes), "streamed_s": streamed, "staged_s": staged, "written_s": written}


# ------------------------------------------------------------------------------------ GPU mode
TENSORS = 1152  # as in the 13.5 GiB state: 384 parameters, each with AdamW's two moments
WARNING = 120.0


def training_state(gib: float, device: torch.device) -> dict:
    """fp32 parameters and AdamW's two moments, `gib` GiB in all, in TENSORS tensors on `device`."""
    per = max(1, int(gib * 1024**3) // 4 // TENSORS)
    params = TENSORS // 3

    def t() -> torch.Tensor:
        return torch.empty(per, dtype=torch.float32, device=device).normal_()

    return {
        "model": {f"layer{i}.weight": t() for i in range(params)},
        "optimizer": {
            "state": {
                i: {"exp_avg": t(), "exp_avg_sq": t(), "step": torch.tensor(10.0)} for i in range(params)
            },
            "param_groups": [{"lr": 1e-4, "params": list(range(params))}],
        },
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def one_copy_gbps(nbytes: int, device: torch.device, into: torch.Tensor) -> float:
    """One copy of `nbytes` from the device into `into` (the snapshot's own host block: the same
    memory, pinned the same way), non-blocking, one synchronize: the link's own speed. Best of 3."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = into[:nbytes]
    best = float("inf")
    for _ in range(3):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(device)
        best = min(best, time.perf_counter() - t)
    del src
    return nbytes / best / 1e9


def parallel_write_seconds(buffers: HostBuffers, directory: Path, writers: int) -> float:
    """The snapshot's bytes written, sha256-hashed and fsynced by `writers` threads, each its share to a
    file of its own, with nothing else: the machine's limit for the commit's own work."""
    block = buffers._block
    assert block is not None
    total = buffers.bytes
    share = -(-total // writers)
    directory.mkdir(parents=True, exist_ok=True)

    def write(i: int) -> None:
        start, end = i * share, min(total, (i + 1) * share)
        view = writable(block)[start:end]
        h = hashlib.sha256()
        fd = os.open(directory / f"part-{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for at in range(0, len(view), 8 * 1024 * 1024):
                chunk = view[at : at + 8 * 1024 * 1024]
                h.update(chunk)
                done = 0
                while done < len(chunk):
                    done += os.write(fd, chunk[done:])
            os.fsync(fd)
        finally:
            os.close(fd)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seconds = time.perf_counter() - t
    shutil.rmtree(directory, ignore_errors=True)
    return seconds


def hardware(gib: float, device: torch.device, root: Path) -> dict[str, float]:
    state = training_state(gib, device)
    sync(device)
    nbytes = sum(v.numel() * v.element_size() for v in tensors(state))
    buffers = HostBuffers()
    t = time.perf_counter()
    buffers.take(state)  # the first take makes (and pins) the buffers
    first = time.perf_counter() - t
    assert buffers._block is not None
    link = one_copy_gbps(nbytes, device, buffers._block)
    stalls = []
    for _ in range(3):
        buffers.take(state)
        stalls.append(buffers.last_seconds)
    stall = min(stalls)
    store_dir = root / f"store-{uuid.uuid4().hex[:8]}"
    env = AgentEnv.model_validate(
        {"SPOTGUARD_CHECKPOINT_URI": f"file://{store_dir}/", "SPOTGUARD_KEEP_CHECKPOINTS": "1"}
    )
    agent = Agent(
        env, CheckpointStore(None, env.checkpoint_uri, keep=1), install_signals=False, ranks=Ranks()
    )
    agent.host_buffers = buffers  # made above, as a running job's agent would have them
    agent.request_stop()
    t = time.perf_counter()
    save(agent, 1, 0.5, state)  # after SIGTERM: at once, as the stop checkpoint
    commit = time.perf_counter() - t
    assert agent.last is not None and agent.last.manifest.total_bytes >= nbytes
    writers = _threads(agent)
    restored, to_device = into_device(f"file://{store_dir}/", state, device, buffers._block, nbytes)
    shutil.rmtree(store_dir, ignore_errors=True)
    limit = parallel_write_seconds(buffers, root / f"plain-{uuid.uuid4().hex[:8]}", writers)
    return {
        "bytes": float(nbytes),
        "link_gbps": link,
        "snapshot_gbps": nbytes / stall / 1e9,
        "stall_s": stall,
        "first_take_s": first,
        "commit_s": commit,
        "limit_s": limit,
        "writers": float(writers),
        "pinned": float(buffers.pinned),
        "restore_s": restored,
        "to_device_gbps": to_device,
    }


def hardware_main(sizes: list[float], device: torch.device, root: Path) -> list[dict[str, float]]:
    """Measure and print each state's figures; returns them."""
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (no CUDA: plain host buffers)"
    print(f"{name}; store file://{root}/ ; {os.cpu_count()} cores; torch {torch.__version__}")
    results = []
    for gib in sizes:
        r = hardware(gib, device, root)
        results.append(r)
        gc.collect()  # this state's buffers and GPU memory go before the next one's are made
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"\ntraining state {r['bytes'] / 1024**3:.2f} GiB ({TENSORS} tensors):")
        one = "one pinned copy" if r["pinned"] else "one copy"
        ratio = r["snapshot_gbps"] / r["link_gbps"]
        lines = [
            (f"{one} of the same bytes", f"{r['link_gbps']:7.2f} GB/s", ""),
            ("snapshot (reused buffers)", f"{r['snapshot_gbps']:7.2f} GB/s", f"x{ratio:.2f} of one copy"),
            (
                "stall of the training loop",
                f"{r['stall_s']:7.3f} s",
                f"buffers made in {r['first_take_s']:.2f} s",
            ),
            ("SIGTERM commit to file://", f"{r['commit_s']:7.2f} s", ""),
            (
                f"same bytes, {int(r['writers'])} writers + sha256 + fsync",
                f"{r['limit_s']:7.2f} s",
                f"commit x{r['commit_s'] / r['limit_s']:.2f} of it",
            ),
            ("the commit's share of 120 s", f"{r['commit_s'] / WARNING * 100:7.1f} %", ""),
            (f"{one} of the same bytes to the device", f"{r['to_device_gbps']:7.2f} GB/s", ""),
            (
                "restore into the state there (file://)",
                f"{r['bytes'] / r['restore_s'] / 1e9:7.2f} GB/s",
                f"x{r['bytes'] / r['restore_s'] / 1e9 / r['to_device_gbps']:.2f} of that copy",
            ),
        ]
        for what, figure, note in lines:
            print(f"  {what:<36} {figure:>12}   {note}".rstrip(), flush=True)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--state-mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--gpu", action="store_true", help="GPU mode (the default when CUDA is there)")
    p.add_argument("--cpu", action="store_true", help="the moto mode even when CUDA is there")
    p.add_argument("--hardware", action="store_true", help="GPU mode's measurements on the CPU")
    p.add_argument("--restore", action="store_true", help="restore mode (bench/restore.py), --sizes GiB")
    p.add_argument("--sizes", default="1,13.5", help="GPU mode: training states in GiB, comma-separated")
    p.add_argument("--dir", type=Path, help="GPU mode: where the file:// store goes (a local disk)")
    args = p.parse_args()
    if args.restore:
        restore_main([float(x) for x in args.sizes.split(",")], args.dir)
        return
    if args.hardware or args.gpu or (torch.cuda.is_available() and not args.cpu):
        device = torch.device("cuda" if torch.cuda.is_available() and not args.hardware else "cpu")
        if args.gpu and device.type != "cuda":
            p.error("--gpu: no CUDA device here (--hardware runs the same measurements on the CPU)")
        root = Path(tempfile.mkdtemp(prefix="spotguard-bench-", dir=args.dir))
        try:
            hardware_main([float(x) for x in args.sizes.split(",")], device, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    # the moto mode's imports here: the GPU mode needs only the agent's own packages (a GPU machine
    # may have no moto)
    import boto3

    from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS, MotoServer

    os.environ.update(FAKE_CREDENTIALS)
    torch.manual_seed(0)
    with MotoServer() as moto:
        s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")
        bucket = "bench-checkpoints"
        s3.create_bucket(Bucket=bucket)
        st = stall(s3, bucket, args.state_mib, args.repeat)
        print(f"training step with a {args.state_mib} MiB state (median of {args.repeat}):")
        base = st["plain"]
        print(f"  no checkpoint   {base * 1000:8.1f} ms")
        for kind in ("async", "sync"):
            print(f"  {kind} save      {st[kind] * 1000:8.1f} ms   x{st[kind] / base:.2f} of a plain step")
        c = commit_vs_put(s3, bucket, args.gib)
        print(f"\ncommit of a {c['bytes'] / 1024**3:.2f} GiB checkpoint (4 files):")
        print(f"  agent commit (parallel multipart + sha256 + manifest)  {c['agent_commit_s']:6.2f} s")
        print(f"  one plain put_object of the same bytes                 {c['single_put_s']:6.2f} s")
        ratio = c["agent_commit_s"] / c["single_put_s"]
        print(f"  ratio agent / put_object                               {ratio:6.2f}")
        s = stop_commit_to_s3(s3, bucket, args.gib)
        gib = s["bytes"] / 1024**3
        print(f"\nstop checkpoint of a {gib:.2f} GiB training state ({TENSORS} tensors) to S3:")
        print(f"  streamed up as written (the agent)                     {s['streamed_s']:6.2f} s")
        print(
            f"  written to a local disk ({s['written_s']:.2f} s), then uploaded       {s['staged_s']:6.2f} s"
            f"   streamed x{s['streamed_s'] / s['staged_s']:.2f} of it"
        )


def restore_main(sizes: list[float], where: Path | None) -> None:
    import boto3
    import restore  # bench/restore.py, beside this script (imported above for the GPU mode's restore)

    from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS, MotoServer

    os.environ.update(FAKE_CREDENTIALS)
    root = Path(tempfile.mkdtemp(prefix="spotguard-bench-", dir=where))
    try:
        with MotoServer() as moto:
            s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")
            s3.create_bucket(Bucket="bench-restores")
            state = lambda gib: training_state(gib, torch.device("cpu"))  # noqa: E731
            restore.report(restore.run(sizes, state, root, s3, "bench-restores"))
        restore.report_gang(restore.gang_share(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
