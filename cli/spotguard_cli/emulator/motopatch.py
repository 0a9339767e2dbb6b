"""What the local stack adds to moto so that concurrent callers see what AWS gives them.

moto's DynamoDB checks a write's condition and then writes, with nothing between them: two threads (moto
server answers each request in a thread of its own, and in-process moto runs in the caller's threads) can
both pass `attribute_not_exists(pk)` and both write. DynamoDB makes a conditional write atomic, and
SpotGuard's claims and compare-and-set writes rely on it. Since the interruption function handles the
records of a batch side by side and the local stack plays Lambda's concurrent invocations, the writes of
moto's DynamoDB are serialised here by one lock (reads need none).

`python -m spotguard_cli.emulator.motopatch -H 127.0.0.1 -p PORT` is moto server with the lock in place.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

_WRITES = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
_lock = threading.RLock()


def atomic_dynamodb_writes() -> None:
    """Serialise moto's DynamoDB writes (idempotent: the methods are wrapped once per process)."""
    from moto.dynamodb.models import DynamoDBBackend

    for name in _WRITES:
        method = getattr(DynamoDBBackend, name, None)
        if method is None or getattr(method, "_spotguard_atomic", False):
            continue
        setattr(DynamoDBBackend, name, _locked(method))


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def write(*args: Any, **kwargs: Any) -> Any:
        with _lock:
            return method(*args, **kwargs)

    write._spotguard_atomic = True  # type: ignore[attr-defined]
    return write


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_server

    atomic_dynamodb_writes()
    moto_server(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
