"""The S3 backend of the checkpoint store: objects in a bucket, moved by boto3's transfer manager
(parallel, multipart), with the transfer settings each process gets (`transfer_for`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig, create_transfer_manager

from spotguard_agent.store_errors import StoreError
from spotguard_agent.store_pipe import _failure, _Pipe, _PipeAborted

PART = 16 * 1024 * 1024  # bytes: multipart above this, in parts of this
# S3 gives one request about 85-90 MB/s (AWS's S3 performance guidelines: about 15 requests in flight
# fill a 10 Gb/s network card). A machine's processes share 64 (about 45 Gb/s), each keeping at least 8:
# one process of a one-GPU job no longer sends a 13.5 GiB stop checkpoint through 8 (0.7 GB/s, 20 s).
NODE_CONCURRENCY = 64
MIN_CONCURRENCY = 8


def transfer_for(concurrency: int, local_processes: int) -> TransferConfig:
    """The transfer manager's settings for one process: `concurrency` requests in flight, or (0) its
    share of the machine's NODE_CONCURRENCY among `local_processes`, at least MIN_CONCURRENCY. In
    memory at most that many parts of 16 MiB (64: 1 GiB)."""
    n = concurrency or max(MIN_CONCURRENCY, NODE_CONCURRENCY // max(1, local_processes))
    config = TransferConfig(
        multipart_threshold=PART,
        multipart_chunksize=PART,
        max_concurrency=n,
        use_threads=True,
        # not the CRT client boto3 picks on instances it deems optimized (p4d, p5, ...) when awscrt is
        # installed: the streams below rely on s3transfer's own reading, limits and retries
        preferred_transfer_client="classic",
    )
    # A file streamed up as it is written (CheckpointStore.parts) holds its parts in memory until sent,
    # and is read by a submission thread of its own for as long as it is written: as many of each as
    # there are requests in flight, or the streams would wait on s3transfer's defaults (10 and 5).
    config.max_in_memory_upload_chunks = n
    config.max_submission_concurrency = n
    return config


TRANSFER = transfer_for(MIN_CONCURRENCY, 1)  # a store made without the agent's environment


class S3Backend:
    """Objects in a bucket, moved by boto3's transfer manager (parallel, multipart)."""

    def __init__(self, client: Any, bucket: str, transfer: TransferConfig) -> None:
        self.client, self.bucket, self.transfer = client, bucket, transfer

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def put_files(self, pairs: list[tuple[Path, str]]) -> None:
        with create_transfer_manager(self.client, self.transfer) as manager:
            for f in [manager.upload(str(path), self.bucket, key) for path, key in pairs]:
                f.result()

    @contextlib.contextmanager
    def streams(self) -> Iterator[Callable[[str], contextlib.AbstractContextManager[Any]]]:
        """`open(key)`: a context whose writable stream goes up to `key` as it is written, through one
        transfer manager for every stream opened here (its requests in flight shared among them). The
        object is complete when the context ends without an error; an error inside it (or an upload that
        fails) leaves no object: the multipart upload is aborted, never completed short. No byte touches
        a local disk."""
        with create_transfer_manager(self.client, self.transfer) as manager:

            @contextlib.contextmanager
            def open_(key: str) -> Iterator[_Pipe]:
                pipe = _Pipe(key, 2 * self.transfer.multipart_chunksize)
                pipe.future = future = manager.upload(pipe, self.bucket, key)
                try:
                    yield pipe
                except BaseException as exc:
                    pipe.abort(f"not completed: its writer failed ({type(exc).__name__})")
                    failure = _failure(future)  # waits for the upload to end (aborted)
                    if isinstance(exc, _PipeAborted) and failure is not None:
                        raise failure from None  # the upload failed first: its error says why
                    raise
                pipe.close()
                future.result()

            yield open_

    def put_bytes(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")

    def get_bytes(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def read_range(self, key: str, start: int, into: list[memoryview]) -> int:
        """Bytes from `start` of `key` in one ranged GET, read into each of `into` in turn (no copy of
        them made on the way); how many the store answered with (fewer when the object is shorter, more
        when it ignored the range: only what `into` holds is read)."""
        size = sum(len(v) for v in into)
        if size == 0:
            return 0
        answer = self.client.get_object(
            Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + size - 1}"
        )
        got = 0
        with contextlib.closing(answer["Body"]) as body:
            for view in into:
                at = 0
                while at < len(view) and (n := body.readinto(view[at:])):
                    at += n
                got += at
                if at < len(view):
                    break
        return max(got, int(answer.get("ContentLength", got)))

    def get_files(self, pairs: list[tuple[str, Path]]) -> None:
        with create_transfer_manager(self.client, self.transfer) as manager:
            for f in [manager.download(self.bucket, key, str(path)) for key, path in pairs]:
                f.result()

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            answer = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
            )
            if answer.get("Errors"):  # Quiet: only the keys that were not deleted come back
                first = answer["Errors"][0]
                raise StoreError(
                    f"{len(answer['Errors'])} of {len(keys[i : i + 1000])} objects not deleted, "
                    f"such as {first.get('Key')} ({first.get('Code')})"
                )
