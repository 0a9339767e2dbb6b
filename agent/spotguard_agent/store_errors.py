"""The checkpoint store's errors, and how restore tells them apart: evidence that a checkpoint is
damaged (pass over it), or a read that may succeed in a few seconds (try it again)."""

from __future__ import annotations

import errno

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotocoreConnectionError
from pydantic import ValidationError
from s3transfer.exceptions import RetriesExceededError


class StoreError(RuntimeError):
    """A checkpoint location, SPOTGUARD_RESUME_FROM or restore target that cannot be used, in one line."""


class OtherRankFailed(StoreError):
    """This rank's part of a checkpoint failed because another rank's did: its text names that rank and
    its error (the one to report, rather than this rank's)."""


class CheckpointUnavailable(StoreError):
    """A committed checkpoint (or the list of them) exists but cannot be read now: restore stops here
    rather than fall back to an older one or start fresh."""


class CheckpointDamaged(ValueError):
    """Evidence that a committed checkpoint is damaged: restore passes over it to the previous one."""


# Error codes of an S3 answer that say "not now" rather than "no" (with any 5xx status and 429).
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
    }
)
# a key that is not there, or shorter than its manifest says (a range past its end)
_MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404", "InvalidRange", "416"})
_TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.EBUSY})
# What reading a checkpoint can raise that is not evidence of damage.
_READ_ERRORS = (ClientError, BotoCoreError, RetriesExceededError, OSError)


def is_damage(exc: BaseException) -> bool:
    """Is this error evidence that the checkpoint itself is damaged (rather than unreadable now)?"""
    if isinstance(exc, CheckpointDamaged | ValidationError):
        return True
    if isinstance(exc, ClientError):  # a key that is not there (not a bucket: NoSuchBucket is no damage)
        return exc.response.get("Error", {}).get("Code") in _MISSING_CODES
    return False


def is_transient(exc: BaseException) -> bool:
    """Might the same read succeed in a few seconds (throttling, 5xx, a timeout, a connection lost)?"""
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = exc.response.get("Error", {}).get("Code")
        return code in _TRANSIENT_CODES or status == 429 or status >= 500
    if isinstance(exc, BotoCoreError):  # before OSError: botocore's timeouts are OSErrors too
        return isinstance(exc, BotocoreConnectionError | HTTPClientError | IncompleteReadError)
    if isinstance(exc, RetriesExceededError):  # s3transfer gave up on a download cut short again and again
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def unreadable(what: str, why: str, tries: int) -> str:
    """The one line of a restore that gives up on a checkpoint it cannot read now (exit 69)."""
    said = f"{tries} tr{'y' if tries == 1 else 'ies'}"
    return f"{what} cannot be read now ({why}; {said}): restore later rather than start from scratch"


def _short(exc: BaseException) -> str:
    if isinstance(exc, RetriesExceededError) and exc.last_exception is not None:
        exc = exc.last_exception
    text = str(exc).splitlines()[0][:200] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
