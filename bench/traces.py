"""The "Can't Be Late" spot availability traces, fetched into the project (docs/traces.md).

The eight traces the capacity benchmark reads have no licence, so the project does not hold them: it holds
their SHA-256s (bench/traces.lock.json) and this fetcher, which puts them in .traces/cant-be-late-2022-10/
(git-ignored). They are copied from a local folder (--from; by default ../shared/traces beside the clone,
when it is there), or else downloaded from GitHub at the locked commit. Every file is checked against the
lock before it is written; a mismatch or a failed download is a one-line error, exit 1, and leaves the
destination as it was (each file goes to a temporary name and is renamed once all eight are verified).

    python bench/traces.py fetch [--dest DIR] [--from DIR | --download]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = Path(__file__).resolve().with_name("traces.lock.json")
DEST = REPO / ".traces" / "cant-be-late-2022-10"
SHARED = REPO.parent / "shared" / "traces" / "cant-be-late-2022-10"
MAX_BYTES = 10 * 1024 * 1024  # each trace is ~12 kB: anything past this is not one
TIMEOUT_SECONDS = 60


class TraceError(Exception):
    """Why the traces could not be fetched, in one line."""


def read_lock(path: Path | None = None) -> dict:
    return json.loads((path or LOCK).read_text())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def url(lock: dict, name: str) -> str:
    return lock["url"].format(commit=lock["commit"], path=lock["path"], name=name)


def default_source() -> Path | None:
    """The local copy to take the traces from (../shared/traces beside the clone), or None: download."""
    return SHARED if SHARED.is_dir() else None


def ready(dest: Path = DEST, lock: dict | None = None) -> bool:
    """Whether dest holds every locked trace with its locked SHA-256."""
    lock = lock or read_lock()
    return all(
        (dest / name).is_file() and sha256((dest / name).read_bytes()) == digest
        for name, digest in lock["files"].items()
    )


def _download(address: str) -> bytes:
    try:
        with urllib.request.urlopen(address, timeout=TIMEOUT_SECONDS) as response:
            data = response.read(MAX_BYTES + 1)
    except (OSError, http.client.HTTPException, ValueError) as e:  # URLError and HTTPError are OSErrors
        reason = getattr(e, "reason", None) or e
        raise TraceError(f"could not download {address}: {' '.join(str(reason).split())}") from e
    if len(data) > MAX_BYTES:
        raise TraceError(f"could not download {address}: more than {MAX_BYTES} bytes")
    return data


def _get(name: str, source: Path | None, lock: dict) -> tuple[bytes, str]:
    if source is None:
        where = url(lock, name)
        return _download(where), where
    path = source / name
    try:
        return path.read_bytes(), str(path)
    except OSError as e:
        raise TraceError(f"could not read {path}: {e.strerror or e}") from e


def _write(path: Path, data: bytes) -> Path:
    """data under a temporary name beside path (renamed later), removed if the write fails."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would outlive the rename
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def fetch(dest: Path = DEST, source: Path | None = None, lock: dict | None = None) -> str:
    """Every locked trace into dest, from source (a folder) or, when source is None, from GitHub.

    Traces already in dest with the locked SHA-256 are kept. Nothing is written until all the others are
    read and verified; then each is written to a temporary name and renamed. Returns a one-line summary;
    raises TraceError (one line) on a missing file, a failed download or a SHA-256 mismatch.
    """
    lock = lock or read_lock()
    wanted: dict[str, bytes] = {}
    for name, digest in lock["files"].items():
        target = dest / name
        if target.is_file() and sha256(target.read_bytes()) == digest:
            continue
        data, where = _get(name, source, lock)
        got = sha256(data)
        if got != digest:
            raise TraceError(f"{where}: sha256 {got} is not the locked {digest}; nothing written")
        wanted[name] = data
    if not wanted:
        return f"{len(lock['files'])} traces already in {dest} (sha256 verified)"
    dest.mkdir(parents=True, exist_ok=True)
    parts: dict[str, Path] = {}
    try:
        for name, data in wanted.items():
            parts[name] = _write(dest / name, data)
        for name, part in parts.items():
            os.replace(part, dest / name)
    except OSError as e:
        raise TraceError(f"could not write into {dest}: {e.strerror or e}") from e
    finally:
        for part in parts.values():
            part.unlink(missing_ok=True)
    how = f"copied from {source}" if source is not None else f"downloaded from {lock['source']}"
    return f"{len(wanted)} of {len(lock['files'])} traces {how} into {dest} (sha256 verified)"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="copy or download the traces and verify them against the lock")
    f.add_argument("--dest", type=Path, default=DEST, help=f"where to put them (default: {DEST})")
    where = f.add_mutually_exclusive_group()
    where.add_argument("--download", action="store_true", help="from GitHub, even when there is a local copy")
    where.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=default_source(),
        help=f"a folder holding them (default: {SHARED} if it exists, else download from GitHub)",
    )
    args = ap.parse_args(argv)
    try:
        print(fetch(args.dest, None if args.download else args.source))
    except TraceError as e:
        print(f"traces: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
