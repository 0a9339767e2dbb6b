"""The agent in a job of 2 nodes x 1 process (gloo, CPU, over 127.0.0.1), run as SpotGuard runs a gang:
each node its own container, whose first process is `spotguard-agent run -- torchrun --nnodes 2
--node-rank K ...` with a control directory of its own, node 0 hosting the rendezvous. A stop for one
node (SIGTERM to its first process, as StopTask sends it) is every node's: one checkpoint of both ranks,
and both nodes exit 75. Checkpoints in a file:// store (the same code path as S3 but the upload)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from spotguard_agent import CheckpointStore  # noqa: E402

from bench.torchrun_jobs import EXIT_RE, STEPS, job_env, same_weights, wrapped  # noqa: E402
from spotguard_cli.local.gang_nodes import NODES, ddp_torchrun  # noqa: E402

pytestmark = pytest.mark.slow  # every test runs two torchruns and their ranks as processes

STOPPED_RE = re.compile(r"stopped on committed checkpoint (\d+) \(step (\d+); ")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gang(store: Path, out: Path, step_seconds: float | None = None) -> list[subprocess.Popen[str]]:
    """Each node's first process: the wrapper over torchrun, told the gang on its command line (node 0
    hosting the rendezvous at 127.0.0.1, on a free port)."""
    port = _free_port()
    return [
        subprocess.Popen(
            wrapped(ddp_torchrun(out, STEPS, step_seconds, rendezvous=(k, port))),
            env=job_env(store),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(NODES)
    ]


def _finish(gang: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    done = []
    for p in gang:
        out, err = p.communicate(timeout=300)
        done.append((p.returncode, out, err))
    return done


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The weights of an uninterrupted 2-node run."""
    d = tmp_path_factory.mktemp("reference")
    out = d / "final.pt"
    done = _finish(_gang(d / "store", out))
    assert [code for code, _, _ in done] == [0, 0], done[1][2][-3000:]
    return out


@pytest.mark.parametrize("warned", [1, 0], ids=["node-1-warned", "node-0-warned"])
def test_sigterm_to_one_node_checkpoints_both_at_one_step_both_exit_75_and_resume_bit_identical(
    tmp_path, reference, warned
):
    store = tmp_path / "store"
    gang = _gang(store, tmp_path / "a.pt", 0.05)
    assert gang[0].stdout is not None
    for line in gang[0].stdout:  # rank 0 (node 0) prints the steps
        if line.startswith("step 5 loss"):
            break
    gang[warned].send_signal(signal.SIGTERM)  # as StopTask does, to that node's first process only
    (code0, out0, err0), (code1, _, err1) = _finish(gang)
    assert (code0, code1) == (75, 75), (err0[-2000:], err1[-2000:])
    stopped = int(EXIT_RE.search(out0)[1])  # type: ignore[index]
    assert 5 <= stopped < STEPS
    # one checkpoint, of both ranks (one a node), at the step where both stopped
    s = CheckpointStore(None, f"file://{store}/")
    assert s.committed() == [0]
    manifest = s.read_manifest(0)
    assert manifest.step == stopped
    names = {f.path for f in manifest.files}
    assert ".metadata" in names and {n.split("_")[2] for n in names if n.startswith("__")} == {"0", "1"}
    # each node's wrapper heard the outcome from its own first rank: the same checkpoint, the same step
    said = [STOPPED_RE.search(err) for err in (err0, err1)]
    assert all(said), (err0[-2000:], err1[-2000:])
    assert {(m[1], m[2]) for m in said if m} == {("0", str(stopped))}

    # resumed on 2 nodes: bit-identical to the uninterrupted 2-node run
    again = _finish(_gang(store, tmp_path / "b.pt"))
    assert [code for code, _, _ in again] == [0, 0], again[1][2][-3000:]
    assert f"resumed after step {stopped} on 2 rank(s)" in again[0][1]
    assert same_weights(tmp_path / "b.pt", reference)
