"""What an error from RunTask (or StartTask, which shares its errors) means for a job. Pure.

Every error ECS documents for the two calls, and the throttling and server errors every AWS API can
answer, falls in one class:

- capacity:  nothing could be placed now (an empty cluster, no container instance in the capacity
             provider, the cluster's limit of tasks waiting in PROVISIONING reached); the job waits in
             the retry queue and SpotGuard asks for capacity;
- transient: throttling, a server error, or a conflict over the launch's client token (a launch in
             flight); the job waits in the retry queue and tries again with a new token;
- access:    SpotGuard may not do this (AccessDenied: a role outside the stack's TaskRoleArns, a
             task definition family outside TaskDefinitionFamilies; Blocked: the account); the job
             fails and says so;
- request:   the request itself is wrong (an unknown cluster, a deregistered task definition, a bad
             parameter or platform version); no retry can help, so the job fails and says why.

An error code not listed here is not classed: the caller raises it, so that the record is retried and,
if it keeps failing, dead-lettered and alarmed, rather than a job being failed on a guess.
"""

from __future__ import annotations

import re
from typing import Literal

RunErrorClass = Literal["capacity", "transient", "access", "request"]

# Messages that say "no room now" or "too fast now" under a code that otherwise means a bad request.
_NO_ROOM = re.compile(
    r"No Container Instances were found in your (cluster|capacity provider)"
    r"|provisioning capacity limit",  # ClientException: too many tasks in PROVISIONING in the cluster
    re.IGNORECASE,
)
_TOO_FAST = re.compile(r"Request limit exceeded|Rate exceeded|Throttl", re.IGNORECASE)

_BY_CODE: dict[str, RunErrorClass] = {
    # documented for RunTask and StartTask
    "AccessDeniedException": "access",
    "BlockedException": "access",
    "ClientException": "request",
    "ClusterNotFoundException": "request",
    "ConflictException": "transient",
    "InvalidParameterException": "request",  # unless its message says there is no room: see below
    "PlatformTaskDefinitionIncompatibilityException": "request",
    "PlatformUnknownException": "request",
    "ServerException": "transient",
    "UnsupportedFeatureException": "request",
    # common to every AWS API (what outlives botocore's standard retries)
    "ThrottlingException": "transient",
    "Throttling": "transient",
    "RequestLimitExceeded": "transient",
    "TooManyRequestsException": "transient",
    "ServiceUnavailableException": "transient",
    "ServiceUnavailable": "transient",
    "InternalFailure": "transient",
    "InternalServerError": "transient",
    "RequestTimeout": "transient",
    "RequestTimeoutException": "transient",
}


def classify_run_error(code: str, message: str) -> RunErrorClass | None:
    """The class of a RunTask/StartTask error; None for a code ECS does not document for them."""
    if code in ("InvalidParameterException", "ClientException"):
        if _NO_ROOM.search(message):
            return "capacity"
        if _TOO_FAST.search(message):  # e.g. "Error retrieving security group information ... Request
            return "transient"  # limit exceeded": a throttled lookup inside ECS, not a bad request
    return _BY_CODE.get(code)
