"""bench/traces.py: the Can't Be Late traces are copied or downloaded, and kept only if their SHA-256 is
the locked one. No network: downloads are served from local files through a patched urlopen; the traces
themselves are stand-ins (the real ones are not in the project), except where ../shared has them."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("bench_traces", REPO / "bench" / "traces.py")
traces = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(traces)

EIGHT = {f"us-west-2{z}_{g}_{n}.json" for z in "ab" for g in ("k80", "v100") for n in (1, 8)}


def stand_ins(folder: Path) -> dict:
    """Eight small traces in the real files' format in folder, and a lock for them (the real one's fields)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for i, name in enumerate(sorted(EIGHT)):
        data = json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 0, i % 2, 1]}).encode()
        (folder / name).write_bytes(data)
        files[name] = hashlib.sha256(data).hexdigest()
    return {**traces.read_lock(), "files": files}


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_the_lock_lists_exactly_the_eight_traces_at_a_full_commit():
    lock = traces.read_lock()
    assert set(lock["files"]) == EIGHT
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in lock["files"].values())
    assert re.fullmatch(r"[0-9a-f]{40}", lock["commit"]) and lock["commit"].startswith("221da1ab")
    assert lock["licence"] == "no licence: fetched, not redistributed"
    assert "Can't Be Late" in lock["paper"] and lock["source"].endswith("skypilot-org/spot-traces")
    assert traces.url(lock, "us-west-2a_k80_1.json") == (
        "https://raw.githubusercontent.com/skypilot-org/spot-traces/"
        f"{lock['commit']}/availability/1-node/aws-10-26-2022/us-west-2a_k80_1.json"
    )


@pytest.mark.skipif(not traces.SHARED.is_dir(), reason="no ../shared/traces beside the clone")
def test_the_lock_matches_the_shared_copies():
    lock = traces.read_lock()
    assert {n: hashlib.sha256((traces.SHARED / n).read_bytes()).hexdigest() for n in EIGHT} == lock["files"]


def test_fetching_from_a_local_folder_copies_and_verifies(tmp_path):
    lock = stand_ins(tmp_path / "src")
    dest = tmp_path / ".traces" / "cant-be-late-2022-10"
    assert not traces.ready(dest, lock)

    summary = traces.fetch(dest, tmp_path / "src", lock)

    assert summary.startswith("8 of 8 traces copied from") and "\n" not in summary
    assert listing(dest) == sorted(EIGHT)  # no temporary files left
    assert all((dest / n).read_bytes() == (tmp_path / "src" / n).read_bytes() for n in EIGHT)
    assert traces.ready(dest, lock)
    assert traces.fetch(dest, tmp_path / "src", lock).startswith("8 traces already in")


def test_a_corrupted_source_file_is_refused_and_nothing_is_left(tmp_path, monkeypatch, capsys):
    lock = stand_ins(tmp_path / "src")
    bad = tmp_path / "src" / "us-west-2b_v100_8.json"
    bad.write_bytes(bad.read_bytes().replace(b"[1, 0", b"[0, 0"))
    dest = tmp_path / "dest"

    with pytest.raises(traces.TraceError, match=r"us-west-2b_v100_8\.json: sha256 .* is not the locked") as e:
        traces.fetch(dest, tmp_path / "src", lock)
    assert "\n" not in str(e.value)
    assert listing(dest) == []  # not even the seven good ones: all or nothing

    lock_file = tmp_path / "traces.lock.json"
    lock_file.write_text(json.dumps(lock))
    monkeypatch.setattr(traces, "LOCK", lock_file)
    assert traces.main(["fetch", "--from", str(tmp_path / "src"), "--dest", str(dest)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("traces: ")
    assert listing(dest) == []


def test_a_corrupted_file_already_in_place_is_replaced(tmp_path):
    lock = stand_ins(tmp_path / "src")
    dest = tmp_path / "dest"
    traces.fetch(dest, tmp_path / "src", lock)
    (dest / "us-west-2a_k80_1.json").write_text("{}")

    assert traces.fetch(dest, tmp_path / "src", lock).startswith("1 of 8 traces copied")
    assert traces.ready(dest, lock)


def serve(folder: Path, monkeypatch) -> list[str]:
    """urlopen serving each URL's last path segment from folder; the URLs asked for are returned."""
    asked = []

    def urlopen(address, timeout=None):
        asked.append(address)
        path = folder / address.rsplit("/", 1)[1]
        if not path.is_file():
            raise urllib.error.HTTPError(address, 404, "Not Found", {}, None)
        return io.BytesIO(path.read_bytes())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return asked


def test_a_download_is_verified_the_same_way(tmp_path, monkeypatch):
    lock = stand_ins(tmp_path / "github")
    asked = serve(tmp_path / "github", monkeypatch)
    dest = tmp_path / "dest"

    assert traces.fetch(dest, None, lock).startswith("8 of 8 traces downloaded from")
    assert sorted(asked) == sorted(traces.url(lock, n) for n in EIGHT)
    assert listing(dest) == sorted(EIGHT) and traces.ready(dest, lock)

    (tmp_path / "github" / "us-west-2a_v100_1.json").write_bytes(b'{"metadata": {}, "data": []}')
    with pytest.raises(
        traces.TraceError, match=r"^https://raw\.githubusercontent\.com/.*v100_1\.json: sha256"
    ):
        traces.fetch(tmp_path / "dest2", None, lock)
    assert listing(tmp_path / "dest2") == []


def test_a_failed_download_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    lock = stand_ins(tmp_path / "github")
    (tmp_path / "github" / "us-west-2b_k80_1.json").unlink()
    serve(tmp_path / "github", monkeypatch)

    with pytest.raises(
        traces.TraceError, match=r"^could not download https://.*us-west-2b_k80_1\.json: Not Found$"
    ):
        traces.fetch(tmp_path / "dest", None, lock)
    assert listing(tmp_path / "dest") == []
