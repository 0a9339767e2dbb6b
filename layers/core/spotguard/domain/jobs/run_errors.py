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

One request error is about the pool, not the request (`pool_refused`): the capacity provider of the
strategy is no longer attached to the cluster, or no longer ACTIVE (detached or being deleted since
discovery last saw it). For a launch SpotGuard placed in a pool, that pool's provider is marked and the
job decided again (another pool, on-demand, a wait); for a request that named the provider itself, it
stays a request error, and the job fails and says why.
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
# ECS's answers when the strategy's capacity provider cannot take tasks, e.g. (InvalidParameterException)
# "The specified capacity provider strategy cannot contain a capacity provider that is not associated with
# the cluster. Associate the capacity provider with the cluster or specify a valid capacity provider and
# try again." and "The specified capacity provider 'gpu-spot' is not in an ACTIVE state. Specify a valid
# capacity provider and try again.", and a provider ECS no longer knows at all.
_PROVIDER_GONE = re.compile(
    r"capacity provider that is not associated with the cluster"
    r"|capacity provider\b[^.]*\bis not in an ACTIVE state"
    r"|capacity provider\b[^.]*\b(?:does not exist|was not found|could not be found)",
    re.IGNORECASE,
)

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


def pool_refused(reason: str) -> bool:
    """Whether a RunTask `request` failure, as the adapter says it ("Code: message"), is ECS refusing the
    strategy's capacity provider (not associated with the cluster, not ACTIVE, unknown) rather than the
    request: the pool a decision chose is gone, not the job's request wrong."""
    code, _, message = reason.partition(": ")
    return code in ("InvalidParameterException", "ClientException") and bool(_PROVIDER_GONE.search(message))
