"""The pipe that streams one file up to S3 as it is written: the writer's thread on one side, boto3's
transfer manager on the other, at most a bounded number of bytes waiting in between
(store_s3.S3Backend.streams)."""

from __future__ import annotations

import collections
import threading
from typing import Any

from spotguard_agent.store_errors import StoreError


class _PipeAborted(StoreError):
    """A stream's writer or its upload ended the other side."""


_POLL_SECONDS = 0.1  # how often a writer waiting for room looks whether its upload failed


class _Pipe:
    """The bytes of one file, from the thread that writes them to the transfer manager, which reads a
    stream that cannot seek in parts of its chunk size. At most `limit` bytes wait in between: a writer
    faster than its upload waits for it. `close` is the end of the file; `abort` ends both sides with
    an error instead, so a file cut short is never taken for a whole one."""

    def __init__(self, key: str, limit: int) -> None:
        self.key, self.limit = key, limit
        self.future: Any = None  # the upload reading it: one that ends (fails) first ends the writer too
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0
        self._closed = False
        self._error: str | None = None
        self._cond = threading.Condition()

    # the writer's side
    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        step = max(1, self.limit // 2)
        for at in range(0, len(view), step):
            piece = bytes(view[at : at + step])  # a copy: the writer may reuse its buffer
            with self._cond:
                self._upload_going()
                while self._held >= self.limit and self._error is None:
                    self._cond.wait(_POLL_SECONDS)
                    self._upload_going()
                self._check()
                if self._closed:
                    raise ValueError(f"{self.key}: written after its end")
                self._chunks.append(piece)
                self._held += len(piece)
                self._cond.notify_all()
        return len(view)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def abort(self, why: str) -> None:
        with self._cond:
            if self._error is None:
                self._error = why
            self._cond.notify_all()

    # the transfer manager's side
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, amount: int | None = -1) -> bytes:
        """`amount` bytes (fewer only at the end of the file), or every byte to the end."""
        out: list[bytes] = []
        wanted = amount if amount is not None and amount >= 0 else None
        got = 0
        with self._cond:
            while wanted is None or got < wanted:
                while not self._chunks and not self._closed and self._error is None:
                    self._cond.wait()
                self._check()
                if not self._chunks:  # closed: the end of the file
                    break
                chunk = self._chunks.popleft()
                if wanted is not None and got + len(chunk) > wanted:
                    keep = wanted - got
                    self._chunks.appendleft(chunk[keep:])
                    chunk = chunk[:keep]
                out.append(chunk)
                got += len(chunk)
                self._held -= len(chunk)
                self._cond.notify_all()
        return out[0] if len(out) == 1 else b"".join(out)

    def _check(self) -> None:
        if self._error is not None:
            raise _PipeAborted(f"{self.key}: {self._error}")

    def _upload_going(self) -> None:
        """An upload that is done while its file is still being written has failed or been cancelled
        (s3transfer marks it done at once, then reads on to the end of the file, skipping every part):
        the writer stops now rather than write the rest of the file for nothing."""
        if self._error is None and self.future is not None and self.future.done():
            self._error = "its upload failed"
            self._cond.notify_all()


def _failure(future: Any) -> BaseException | None:
    try:
        future.result()
    except BaseException as exc:
        return exc
    return None
