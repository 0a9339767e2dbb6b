"""The parts of the agent for multi-process and large jobs, in one process: the reused host buffers, the
files hashed as they are written, the stop budget, the wrapper's control directory."""

from __future__ import annotations

import gc
import hashlib
import logging
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from spotguard_agent import Agent, AgentEnv, CheckpointStore  # noqa: E402
from spotguard_agent.imds import _unix_time  # noqa: E402
from spotguard_agent.ranks import ControlDir, Ranks  # noqa: E402
from spotguard_agent.snapshot import HostBuffers, state_bytes  # noqa: E402
from spotguard_agent.store_errors import StoreError  # noqa: E402
from spotguard_agent.torch_state import STATE_FILE, load, save  # noqa: E402


def _agent(tmp_path, control: ControlDir | None = None, **env: str) -> Agent:
    e = AgentEnv.model_validate({"SPOTGUARD_CHECKPOINT_URI": f"file://{tmp_path}/store/", **env})
    return Agent(
        e, CheckpointStore(None, e.checkpoint_uri), install_signals=False, ranks=Ranks(), control=control
    )


def _state() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),  # integer keys, param_groups: not tensors
        "rng": torch.get_rng_state(),
        "step": 7,
        "empty": {},
        "pair": (1, torch.arange(3, dtype=torch.bfloat16)),
        "columns": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
        "nothing": torch.empty(0, 5),
    }


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return (
            type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b


def test_host_buffers_are_made_once_and_each_copy_owns_exactly_its_bytes():
    state = _state()
    buffers = HostBuffers()
    first = buffers.take(state)
    assert _equal(first, state) and not buffers.pinned  # no CUDA here: plain memory, the same code
    second = buffers.take(state)
    assert buffers.allocations == 1  # reused
    assert second["model"]["0.weight"].data_ptr() == first["model"]["0.weight"].data_ptr()
    state["model"]["0.weight"].add_(1.0)  # the training goes on changing the originals
    assert not torch.equal(second["model"]["0.weight"], state["model"]["0.weight"])
    for t in (second["model"]["0.weight"], second["columns"], second["pair"][1]):
        assert t.untyped_storage().size() == t.nbytes  # serialised alone, never the whole block
    assert buffers.bytes >= state_bytes(state)
    buffers.take({"other": torch.ones(3)})  # another shape: new buffers
    assert buffers.allocations == 2


def test_a_state_whose_layout_changed_part_way_is_copied_whole_into_new_buffers():
    # copies start as the walk finds each tensor: where a later tensor no longer fits (another shape,
    # another dtype, one tensor more or fewer) the buffers are made again and every tensor copied anew
    buffers = HostBuffers()
    state = {"a": torch.arange(4.0), "b": torch.arange(6.0), "c": [torch.ones(2, 2)]}
    buffers.take(state)
    wide = torch.ones(2, 2, dtype=torch.float64)
    for changed in (
        {"a": torch.arange(4.0) + 1, "b": torch.arange(7.0), "c": [torch.ones(2, 2)]},
        {"a": torch.arange(4.0) + 2, "b": torch.arange(7.0), "c": [wide]},
        {"a": torch.arange(4.0) + 3, "b": torch.arange(7.0), "c": [wide, wide]},
        {"a": torch.arange(4.0) + 4, "b": torch.arange(7.0)},
    ):
        before = buffers.allocations
        copy = buffers.take(changed)
        assert _equal(copy, changed) and buffers.allocations == before + 1
        again = buffers.take(changed)  # the same layout again: the same buffers, copied in place
        assert _equal(again, changed) and buffers.allocations == before + 1


def test_a_tensor_that_cannot_be_copied_after_others_fails_the_take_and_leaves_the_buffers_usable():
    buffers = HostBuffers()
    state = {"a": torch.arange(4.0), "b": torch.arange(6.0)}
    buffers.take(state)
    with pytest.raises(TypeError, match="dense tensors and DTensors only"):
        buffers.take({"a": torch.arange(4.0), "b": torch.arange(6.0).to_sparse()})
    assert _equal(buffers.take(state), state) and buffers.allocations == 1


class _FakeCudart:
    """torch.cuda.cudart() where there is no GPU: records what is registered and unregistered."""

    def __init__(self, code: int = 0) -> None:
        self.code = code
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []
        self.cleared = False

    def cudaHostRegister(self, address: int, size: int, flags: int) -> int:
        self.registered.append((address, size))
        return self.code

    def cudaHostUnregister(self, address: int) -> int:
        self.unregistered.append(address)
        return 0

    def cudaGetLastError(self) -> int:
        self.cleared = True
        return 0


def test_pinned_buffers_are_exactly_the_states_bytes_registered_and_unregistered_when_they_go(monkeypatch):
    from spotguard_agent import snapshot

    cudart = _FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    state = {"w": torch.arange(10.0), "b": torch.ones(3, dtype=torch.bfloat16)}
    torch.use_deterministic_algorithms(True)  # which fills new tensors: not the block, written anyway
    try:
        block, pinned = snapshot._host_block(1_000_003, pinned=True)
        assert torch.utils.deterministic.fill_uninitialized_memory  # the job's setting, given back
    finally:
        torch.use_deterministic_algorithms(False)
    # not rounded up to a power of two, as PyTorch's pinned allocator would (2 MiB here, 16 GiB for 13.5)
    assert pinned and block.numel() == 1_000_003 and cudart.registered == [(block.data_ptr(), 1_000_003)]
    address = block.data_ptr()
    del block
    gc.collect()
    assert cudart.unregistered == [address]  # before the memory went back

    buffers = HostBuffers()
    buffers._ensure([((10,), torch.float32), ((3,), torch.bfloat16)], pinned=True)
    assert buffers.pinned and cudart.registered[-1][1] == buffers.bytes == 128  # 64-byte aligned slices
    views = buffers._views
    for src, dst in zip(state.values(), views, strict=True):
        dst.copy_(src)
    assert torch.equal(views[0], state["w"]) and torch.equal(views[1], state["b"])


def test_where_registering_fails_the_pinned_allocator_is_used_after_all(monkeypatch):
    from spotguard_agent import snapshot

    cudart = _FakeCudart(code=712)  # cudaErrorHostMemoryAlreadyRegistered
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    made: list[dict] = []
    empty = torch.empty

    def recording_empty(*args, **kwargs):
        made.append(kwargs)
        return empty(*args, **{k: v for k, v in kwargs.items() if k != "pin_memory"})

    monkeypatch.setattr(snapshot.torch, "empty", recording_empty)
    block, pinned = snapshot._host_block(4096, pinned=True)
    assert pinned and block.numel() == 4096 and made[-1].get("pin_memory") is True
    assert cudart.cleared  # the failed call's error is not left for the next kernel launch to raise


def test_containers_keep_their_kind():
    buffers = HostBuffers()
    ordered = OrderedDict(a=torch.ones(1), b=[torch.zeros(2), "x"])
    copy = buffers.take(ordered)
    assert isinstance(copy, OrderedDict) and isinstance(copy["b"], list) and copy["b"][1] == "x"


def test_a_saved_state_loads_back_exactly_with_every_file_hashed_as_written(tmp_path):
    agent = _agent(tmp_path)
    state = _state()
    save(agent, 7, 0.5, state, sync=True)
    committed = agent.last
    assert committed is not None
    directory = tmp_path / "store" / "checkpoints" / "0000000000"
    for entry in committed.manifest.files:  # the hash written beside each file is the file's
        data = (directory / entry.path).read_bytes()
        assert len(data) == entry.size and hashlib.sha256(data).hexdigest() == entry.sha256
    assert agent.restore(tmp_path / "restored") is not None  # restore checks them all again
    loaded = load(tmp_path / "restored")
    assert _equal(loaded, state)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters())
    model.load_state_dict(loaded["model"])
    opt.load_state_dict(loaded["optimizer"])
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])


@pytest.mark.skipif(
    not hasattr(torch.serialization, "set_crc32_options"), reason="a torch without the CRC32 setting"
)
def test_the_writers_skip_the_zip_crc32_the_sha256_covers_and_leave_the_jobs_own_setting_alone(tmp_path):
    from spotguard_agent.torch_state import HashingFileSystem

    fs = HashingFileSystem()
    assert torch.serialization.get_crc32_options()  # the job's own torch.save computes it
    with fs.create_stream(tmp_path / "f", "wb") as stream:
        assert not torch.serialization.get_crc32_options()  # while the agent writes this file
        torch.save(torch.arange(5.0), stream)
    assert torch.serialization.get_crc32_options()  # given back in the writer's thread
    entry, blocks = fs.entries()  # the file, and the file of its blocks (blocks.0.json)
    data = (tmp_path / "f").read_bytes()
    assert entry.sha256 == hashlib.sha256(data).hexdigest() and entry.blocks == blocks.path
    assert torch.equal(torch.load(tmp_path / "f", weights_only=True), torch.arange(5.0))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the writer's end
def test_a_writer_thread_that_fails_fails_the_save_and_the_last_checkpoint_stays(tmp_path, monkeypatch):
    """DCP's extra writer threads end on an error without telling the save, which went on to write the
    metadata and files of the other threads: a checkpoint without those tensors, committed."""
    import errno
    import threading

    from spotguard_agent.torch_state import _HashingRaw

    agent = _agent(tmp_path, SPOTGUARD_WRITE_THREADS="4")
    save(agent, 1, 0.1, _state(), sync=True)
    write = _HashingRaw.write

    def full_disk_for_threads(self, b):
        if threading.current_thread() is not threading.main_thread():
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, b)

    monkeypatch.setattr(_HashingRaw, "write", full_disk_for_threads)
    with pytest.raises(OSError, match="No space left on device") as failed:
        save(agent, 2, 0.2, _state(), sync=True)
    assert "\n" not in str(failed.value).strip()
    monkeypatch.undo()
    assert agent.store.committed() == [0] and agent.last.manifest.step == 1
    assert agent.restore(tmp_path / "r") is not None and load(tmp_path / "r")["step"] == 7


def test_load_in_place_fills_the_given_tensors(tmp_path):
    agent = _agent(tmp_path)
    state = _state()
    save(agent, 1, 0.1, state, sync=True)
    agent.restore(tmp_path / "r")
    template = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
    target = template["model"]["0.weight"]
    loaded = load(tmp_path / "r", into=template)
    assert torch.equal(target, state["model"]["0.weight"])  # in place
    assert loaded["model"]["0.weight"] is target and loaded["step"] == 7


def test_a_checkpoint_of_the_earlier_single_file_format_still_loads(tmp_path):
    torch.save({"step": 3, "w": torch.ones(2)}, tmp_path / STATE_FILE)
    assert load(tmp_path)["step"] == 3


def test_async_saves_reuse_the_buffers_and_commit_in_order(tmp_path):
    agent = _agent(tmp_path)
    state = _state()
    for step in range(3):
        save(agent, step, step / 3, state)
    agent.close()
    assert agent.store.committed() == [0, 1, 2] and agent.host_buffers.allocations == 1
    assert agent.last.manifest.step == 2


def test_a_stop_checkpoint_that_cannot_fit_is_said_once_and_the_last_committed_one_kept(tmp_path, caplog):
    agent = _agent(tmp_path, SPOTGUARD_STOP_TIMEOUT_SECONDS="0.001")
    save(agent, 4, 0.4, _state(), sync=True)  # measured: what a commit takes here
    assert agent.commit_estimate() is not None
    agent.request_stop()
    time.sleep(0.01)
    with caplog.at_level(logging.WARNING, logger="spotguard.agent"):
        assert agent.should_save() is False
        assert agent.should_save() is False
    said = [r.getMessage() for r in caplog.records if "not starting it" in r.getMessage()]
    assert len(said) == 1 and "committed checkpoint 0 (step 4)" in said[0]
    assert agent.should_exit() is True
    assert agent.store.committed() == [0]


def test_a_stop_checkpoint_that_fits_is_made_and_leaves_retention_to_the_next_attempt(tmp_path):
    agent = _agent(tmp_path, SPOTGUARD_STOP_TIMEOUT_SECONDS="120", SPOTGUARD_KEEP_CHECKPOINTS="1")
    agent.store.keep = 1
    save(agent, 3, 0.3, _state(), sync=True)
    save(agent, 4, 0.4, _state(), sync=True)
    assert agent.store.committed() == [1]
    agent.request_stop()
    assert agent.should_save() is True
    save(agent, 5, 0.5, _state())  # after the stop: at once, and nothing deleted meanwhile
    assert agent.should_exit() is True and agent.store.committed() == [1, 2]
    after = _agent(tmp_path)  # the next attempt's first commit applies retention
    after.store.keep = 1
    save(after, 6, 0.6, _state(), sync=True)
    assert after.store.committed() == [3]


def test_without_a_measured_commit_the_stop_checkpoint_is_tried(tmp_path):
    agent = _agent(tmp_path, SPOTGUARD_STOP_TIMEOUT_SECONDS="0.001")
    agent.request_stop()
    assert agent.should_save() is True  # nothing measured and nothing committed: nothing to keep


def test_a_spot_notice_shortens_the_budget(tmp_path):
    agent = _agent(tmp_path, SPOTGUARD_STOP_TIMEOUT_SECONDS="120")
    agent.request_stop(deadline=time.time() + 10)
    assert 9 < agent.budget_left() <= 10
    assert _unix_time("2026-11-22T08:22:00Z") == 1795335720.0 and _unix_time("soon") is None


def test_the_control_directory_carries_requests_and_the_outcome(tmp_path):
    wrapper = ControlDir(tmp_path)
    wrapper.request_checkpoint("before the rank started")
    rank = ControlDir(tmp_path)
    assert rank.new_checkpoint_request() is False  # an old request is not answered again
    wrapper.request_checkpoint("SIGUSR1")
    assert rank.new_checkpoint_request() is True and rank.new_checkpoint_request() is False
    assert rank.stop_request() is None
    wrapper.request_stop(123.0, "SIGTERM")
    assert rank.stop_request() == {"deadline": 123.0, "why": "SIGTERM"}
    rank.write_outcome(75, 4, 40, "committed")
    assert wrapper.outcome() == {"exit": 75, "sequence": 4, "step": 40, "why": "committed"}
    assert wrapper.started() is False  # no process has said it uses the agent
    rank.announce(0)
    assert wrapper.started() is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "outcome", "started", "stop"]


def test_the_agent_reads_the_wrapper_requests_at_the_step_boundary(tmp_path):
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    agent = _agent(tmp_path, control=ControlDir(control_dir))
    assert ControlDir(control_dir).started()  # made: the wrapper now waits for its stop checkpoint
    agent._last_commit = time.monotonic()
    assert agent.should_save() is False
    ControlDir(control_dir).request_checkpoint("SIGUSR1")
    assert agent.should_save() is True and not agent.stopping
    save(agent, 1, 0.1, {"w": torch.ones(2)}, sync=True)
    assert agent.should_save() is False
    ControlDir(control_dir).request_stop(time.time() + 60, "SIGTERM")
    assert agent.should_save() is True and agent.stopping and agent.budget_left() <= 60
    save(agent, 2, 0.2, {"w": torch.ones(2)})
    assert agent.should_exit() is True
    assert ControlDir(control_dir).outcome() == {
        "exit": 75,
        "sequence": 1,
        "step": 2,
        "why": "committed the stop checkpoint",
    }


def test_ranks_come_from_torchrun_environment():
    assert Ranks.from_env({}) == Ranks(0, 1, 0, 1)
    assert Ranks.from_env({"RANK": "1"}) == Ranks(0, 1, 0, 1)  # a stray RANK without a world: one process
    r = Ranks.from_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"})
    assert r.distributed and not r.leader and r.local_world == 4
    with pytest.raises(ValueError, match="do not fit"):
        Ranks.from_env({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="whole number"):
        Ranks.from_env({"WORLD_SIZE": "two"})


def test_s3_requests_in_flight_are_the_machines_64_shared_among_its_processes_at_least_8_each():
    from spotguard_agent.store_s3 import transfer_for

    assert transfer_for(0, 1).max_concurrency == 64  # one process of a one-GPU job: its whole share
    assert transfer_for(0, 4).max_concurrency == 16
    assert transfer_for(0, 8).max_concurrency == 8
    assert transfer_for(0, 16).max_concurrency == 8  # never fewer than 8
    assert transfer_for(24, 8).max_concurrency == 24  # SPOTGUARD_S3_CONCURRENCY, as it says
    assert transfer_for(0, 1).multipart_chunksize == 16 * 1024 * 1024


def test_the_agent_s3_client_has_a_connection_for_every_request_in_flight(tmp_path):
    env = {"SPOTGUARD_CHECKPOINT_URI": "s3://bucket-x/jobs/a/", "SPOTGUARD_WATCH_METADATA": "false"}
    env |= {"AWS_DEFAULT_REGION": "us-east-1", "RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}
    agent = Agent.from_env(env)
    assert agent.store.transfer.max_concurrency == 16  # 64 among 4 processes on the machine
    assert agent.store.client.meta.config.max_pool_connections >= 16
    agent = Agent.from_env({**env, "SPOTGUARD_S3_CONCURRENCY": "40"})
    assert agent.store.transfer.max_concurrency == 40
    assert agent.store.client.meta.config.max_pool_connections >= 40
    with pytest.raises(StoreError, match="SPOTGUARD_S3_CONCURRENCY"):
        Agent.from_env({**env, "SPOTGUARD_S3_CONCURRENCY": "many"})


def _sigterm_once_ready(command: list[str], env: dict[str, str]) -> tuple[int, float, str]:
    """Start `command` (the wrapper over one that prints 'ready' when it is), send it SIGTERM once it is
    ready, as StopTask does, and wait for it: its exit status, the seconds from the signal to its end,
    and what it wrote to stderr."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, time.monotonic() - started, err


@pytest.mark.slow  # the wrapper as a process
def test_the_relay_passes_the_exit_code_through_and_forwards_sigterm_after_the_deadline(tmp_path):
    base = [sys.executable, "-m", "spotguard_agent.wrapper", "run", "--"]
    env = {
        "PATH": "/usr/bin:/bin",
        "SPOTGUARD_WATCH_METADATA": "false",
        "SPOTGUARD_STOP_TIMEOUT_SECONDS": "0.5",
    }
    done = subprocess.run([*base, sys.executable, "-c", "import sys; sys.exit(3)"], env=env, timeout=60)
    assert done.returncode == 3
    # a command whose process made its agent but never reaches a step boundary: it gets SIGTERM itself
    # once the stop budget and 5 s are past
    uses_the_agent = (
        "from spotguard_agent.ranks import ControlDir; import time; "
        "ControlDir.from_env().announce(0); print('ready', flush=True); time.sleep(60)"
    )
    code, took, err = _sigterm_once_ready([*base, sys.executable, "-c", uses_the_agent], env)
    assert code == 128 + signal.SIGTERM and 5 <= took < 30
    assert "no process reported a committed checkpoint" in err


@pytest.mark.slow  # the wrapper as a process
def test_the_relay_stops_a_command_with_no_agent_yet_at_once(tmp_path):
    """Nothing would answer the stop request (no process has made its agent: a node of a gang waiting
    at torchrun's rendezvous for the others, a job still starting): the command gets SIGTERM now, and
    stops in seconds instead of at ECS's SIGKILL."""
    env = {"PATH": "/usr/bin:/bin", "SPOTGUARD_WATCH_METADATA": "false"}  # a 120 s stop budget
    sleeper = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"]
    code, took, err = _sigterm_once_ready(
        [sys.executable, "-m", "spotguard_agent.wrapper", "run", "--", *sleeper], env
    )
    assert code == 128 + signal.SIGTERM and took < 5
    assert "no process uses the agent yet, nothing to checkpoint: SIGTERM to the command" in err


@pytest.mark.slow  # a process
def test_a_late_sigusr1_after_close_does_not_turn_a_finished_job_into_a_failure(tmp_path):
    """Found by CI's capacity demo: a move's SIGUSR1 reached the job as it finished; Python's exit had put
    SIGUSR1 back to its default action, and the job that succeeded exited 138, a failure."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "late.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, signal, sys
            sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / "agent")!r})
            os.environ["SPOTGUARD_CHECKPOINT_URI"] = "file://{tmp_path}/ckpt/"
            os.environ["SPOTGUARD_WATCH_METADATA"] = "false"
            from spotguard_agent.agent import Agent
            agent = Agent.from_env()
            agent.close()  # the training is done
            os.kill(os.getpid(), signal.SIGUSR1)  # a late move's signal, as the process ends
            print("finished", flush=True)
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "finished" in done.stdout, done.stderr


def test_dcp_s_exception_becomes_this_rank_s_own_error_or_names_the_rank_that_failed():
    from spotguard_agent.store_errors import OtherRankFailed
    from spotguard_agent.torch_state import _first_failure
    from torch.distributed.checkpoint.api import CheckpointException

    full = OSError(28, "No space left on device")
    both = CheckpointException("failed", {1: (full, None), 3: (ValueError("x"), None)})
    assert _first_failure(both, 1) is full  # this rank's own, as it raised it
    other = _first_failure(both, 0)
    assert (
        isinstance(other, OtherRankFailed)
        and str(other) == "rank 1: OSError: [Errno 28] No space left on device"
    )
    interrupted = KeyboardInterrupt()
    assert _first_failure(CheckpointException("failed", {0: (interrupted, None)}), 2) is interrupted
