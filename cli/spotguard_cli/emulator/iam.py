"""IAM for the local stack: each function held to the actions its role allows, which moto does not do.

moto answers every call whatever the caller's role says, so a code path that makes a call its role lacks
passes every local test and fails on AWS (the task-events function once sent SIGUSR1 through SSM with no
`ssm:SendCommand`). `RoleGuard` reads each function's role from the translated template (its inline
policies, the stack's managed policies it attaches, and the AWS managed policies SAM adds) and checks
every call SpotGuard's clients make while a function's handler runs: a call the role does not allow is
refused as AWS would refuse it (AccessDeniedException) and kept in `denied`, so a test can fail on it even
where the code logs the error and goes on.

The check is by action, not by resource or condition: it finds a missing permission, not a resource
pattern too narrow (the template tests check those).
"""

from __future__ import annotations

import fnmatch
import threading
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from spotguard.adapters import clients
from spotguard_cli.emulator.template import resolve

if TYPE_CHECKING:
    from spotguard_cli.emulator.stack import DeployedStack

# The function whose handler is running in this thread or task (FunctionHost.invoke sets it): what a call
# is put down to. Records handled side by side run in copies of their invocation's context.
RUNNING: ContextVar[str | None] = ContextVar("spotguard_running_function", default=None)

# Every guard installed in this process, oldest first: the test fixtures read the denials of the guards
# installed while a test ran (tests/integration/conftest.py, fresh_aws).
INSTALLED: list[RoleGuard] = []

# What the AWS managed policies SAM attaches allow (their documents, trimmed to the actions).
AWS_MANAGED = {
    "AWSLambdaBasicExecutionRole": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
    "AWSLambdaSQSQueueExecutionRole": [
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:GetQueueAttributes",
        "logs:CreateLogGroup",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    ],
    "AWSXrayWriteOnlyAccess": ["xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSampling*"],
    "AWSXRayDaemonWriteAccess": ["xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSampling*"],
}

# An API operation authorised under another action name (the service authorization reference).
_ACTION_OF = {
    "s3:HeadObject": ["s3:GetObject"],
    "s3:HeadBucket": ["s3:ListBucket"],
    "s3:ListObjectsV2": ["s3:ListBucket"],
    "s3:ListObjects": ["s3:ListBucket"],
    "s3:ListObjectVersions": ["s3:ListBucketVersions"],
    "s3:CreateMultipartUpload": ["s3:PutObject"],
    "s3:UploadPart": ["s3:PutObject"],
    "s3:CompleteMultipartUpload": ["s3:PutObject"],
    "s3:CopyObject": ["s3:GetObject", "s3:PutObject"],
    "s3:GetBucketEncryption": ["s3:GetEncryptionConfiguration"],
    "s3:GetPublicAccessBlock": ["s3:GetBucketPublicAccessBlock"],
    "s3:GetBucketNotificationConfiguration": ["s3:GetBucketNotification"],
    "sqs:SendMessageBatch": ["sqs:SendMessage"],
    "sqs:DeleteMessageBatch": ["sqs:DeleteMessage"],
    "sqs:ChangeMessageVisibilityBatch": ["sqs:ChangeMessageVisibility"],
    "dynamodb:TransactGetItems": ["dynamodb:GetItem"],
}
_TRANSACT_WRITE = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}
_PREFIX_OF = {"monitoring": "cloudwatch"}  # signing names that are not the IAM prefix


def actions_of(model: Any, params: dict[str, Any], encrypted_topics: bool = False) -> list[str]:
    """The IAM actions one API call needs: its own, and those its parameters add (tags given at creation,
    roles passed, KMS for a topic encrypted with a customer key: `encrypted_topics`)."""
    prefix = model.service_model.signing_name
    prefix = _PREFIX_OF.get(prefix, prefix)
    name = f"{prefix}:{model.name}"
    if name == "dynamodb:TransactWriteItems":
        kinds = {k for item in params.get("TransactItems", []) for k in item}
        return sorted(f"dynamodb:{_TRANSACT_WRITE[k]}" for k in kinds if k in _TRANSACT_WRITE)
    actions = list(_ACTION_OF.get(name, [name]))
    if name == "ecs:RunTask":
        if params.get("tags"):
            actions.append("ecs:TagResource")  # tags at launch are authorised as TagResource
        overrides = params.get("overrides") or {}
        volumes = params.get("volumeConfigurations") or []
        if (
            overrides.get("taskRoleArn")
            or overrides.get("executionRoleArn")
            or any((v.get("managedEBSVolume") or {}).get("roleArn") for v in volumes)
        ):
            actions.append("iam:PassRole")
    if name == "ec2:CreateSnapshot" and params.get("TagSpecifications"):
        actions.append("ec2:CreateTags")
    if name == "sns:Publish" and encrypted_topics:
        actions += ["kms:GenerateDataKey", "kms:Decrypt"]
    return actions


@dataclass(frozen=True)
class Denial:
    function: str
    action: str
    operation: str

    def __str__(self) -> str:
        return f"{self.function}'s role does not allow {self.action} ({self.operation})"


@dataclass
class RoleGuard:
    """Each function's allowed and denied action patterns; `install` puts the check on every client."""

    allowed: dict[str, list[str]]  # function logical id -> action patterns its role allows
    refused: dict[str, list[str]] = field(default_factory=dict)  # -> patterns denied on every resource
    encrypted_topics: bool = False  # the stack's topics use a customer key: Publish needs KMS too
    denied: list[Denial] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, cfn: dict[str, Any], parameters: dict[str, str], pseudo: dict[str, str]) -> RoleGuard:
        """The roles of the translated template's functions, for the stack's parameters."""
        allowed: dict[str, list[str]] = {}
        refused: dict[str, list[str]] = {}
        resources = cfn["Resources"]
        for logical_id, res in resources.items():
            if res["Type"] != "AWS::Lambda::Function":
                continue
            role = res["Properties"]["Role"]["Fn::GetAtt"][0]
            props = resolve(cfn, resources[role]["Properties"], parameters, pseudo)
            documents = [p["PolicyDocument"] for p in props.get("Policies", [])]
            for arn in props.get("ManagedPolicyArns", []):
                if arn.startswith("<") and arn[1:-1] in resources:  # one of the stack's managed policies
                    policy = resolve(cfn, resources[arn[1:-1]]["Properties"], parameters, pseudo)
                    documents.append(policy["PolicyDocument"])
                else:
                    documents.append(
                        {"Statement": [{"Effect": "Allow", "Action": AWS_MANAGED[arn.rsplit("/", 1)[-1]]}]}
                    )
            allow, deny = allowed.setdefault(logical_id, []), refused.setdefault(logical_id, [])
            for doc in documents:
                for s in doc["Statement"]:
                    acts = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
                    if s["Effect"] == "Allow":
                        allow += acts
                    elif s.get("Resource") == "*":  # a Deny scoped to resources does not deny the action
                        deny += acts
        encrypted = any(
            r["Type"] == "AWS::SNS::Topic" and "KmsMasterKeyId" in r.get("Properties", {})
            for r in resources.values()
        )
        return cls(allowed=allowed, refused=refused, encrypted_topics=encrypted)

    @classmethod
    def installed_for(cls, stack: DeployedStack) -> RoleGuard:
        """The roles of a deployed stack, for the parameters it was deployed with, held to every call."""
        guard = cls.of(stack.template, stack.parameters, stack.pseudo)
        guard.install()
        return guard

    def allows(self, function: str, action: str) -> bool:
        def matches(patterns: list[str]) -> bool:
            return any(fnmatch.fnmatchcase(action.lower(), p.lower()) for p in patterns)

        return matches(self.allowed.get(function, [])) and not matches(self.refused.get(function, []))

    def install(self) -> None:
        clients.on_every_call(self._check)
        INSTALLED.append(self)

    def _check(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        function = RUNNING.get()
        if function is None or function not in self.allowed:  # not a function's call: the test's own
            return
        for action in actions_of(model, params, self.encrypted_topics):
            if not self.allows(function, action):
                with self._lock:
                    self.denied.append(Denial(function, action, model.name))
                raise ClientError(
                    {
                        "Error": {
                            "Code": "AccessDeniedException",
                            "Message": f"{function}'s role is not authorized to perform: {action}",
                        }
                    },
                    model.name,
                )
