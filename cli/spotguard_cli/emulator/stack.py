"""The template deployed into moto (moto server, or moto in this process): `deploy` and the `DeployedStack`
it returns, with each function's configuration as the stack resolved it.

`deploy` translates template.yaml with aws-sam-translator, uploads each code folder as a zip and creates
the stack in moto's CloudFormation. moto creates every resource but AWS::SQS::QueuePolicy,
AWS::S3::BucketPolicy and AWS::CloudWatch::Alarm, which it accepts and skips: `deploy` creates the queue
policies (moto stores them without enforcing them) and the dead-letter alarms directly; not the bucket
policy, which moto's S3 would enforce, and which denies every request without TLS. It also puts the
bucket's EventBridge notification configuration, which moto's CloudFormation drops.
"""

from __future__ import annotations

import functools
import io
import json
import re
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

from spotguard_cli.emulator.motopatch import atomic_dynamodb_writes
from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS
from spotguard_cli.emulator.template import (
    CODE_BUCKET,
    NO_VALUE,
    REPO,
    Intrinsics,
    code_locations,
    load,
    stamp,
    translate,
)

STACK = "spotguard"


@dataclass
class DeployedStack:
    """The stack as moto holds it after `deploy`: its outputs and its functions' configuration. Nothing
    runs here; `LocalSystem` (system.py) runs the functions against it."""

    endpoint: str | None  # None: moto in this process (mock_aws), for tests
    region: str
    outputs: dict[str, str]
    functions: dict[str, FunctionConfig] = field(default_factory=dict)
    created_directly: list[str] = field(default_factory=list)  # what moto's CloudFormation skips
    template: dict[str, Any] = field(default_factory=dict, repr=False)  # as translated and created
    parameters: dict[str, str] = field(default_factory=dict)
    _clients: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def client(self, service: str) -> Any:
        """One client per service for this stack (clients are thread-safe; creating one costs ~20 ms)."""
        with _LOCK:
            if service not in self._clients:
                self._clients[service] = _session(self.endpoint is None).client(
                    service, endpoint_url=self.endpoint, region_name=self.region, **_creds()
                )
            return self._clients[service]

    @property
    def account(self) -> str:
        return self.outputs.get("AccountId", "123456789012")

    @property
    def pseudo(self) -> dict[str, str]:
        """The pseudo parameters CloudFormation resolved the template with."""
        return {"AWS::Partition": "aws", "AWS::Region": self.region, "AWS::AccountId": self.account}


@dataclass
class FunctionConfig:
    logical_id: str
    name: str
    code_dir: Path
    handler: str
    environment: dict[str, str]
    batch_size: int = 10
    queue_arn: str | None = None  # the first queue it reads
    queues: dict[str, int] = field(default_factory=dict)  # every queue it reads -> batch size
    max_concurrency: dict[str, int] = field(default_factory=dict)  # queue -> ScalingConfig's, if set
    reserved_concurrency: int | None = None  # ReservedConcurrentExecutions, if set
    memory_mb: int = 128


_LOCK = threading.Lock()
_SESSIONS: dict[bool, boto3.session.Session] = {}


def _session(in_process: bool) -> boto3.session.Session:
    """One boto3 session per process, so that every stack's clients share the service models it loaded
    (moto's mock_aws resets boto3's default session, which made each test's stack load them again). The
    in-process one is created under mock_aws, when moto's hooks are in botocore's, like every session."""
    if in_process not in _SESSIONS:
        _SESSIONS[in_process] = boto3.session.Session()
    return _SESSIONS[in_process]


def _creds() -> dict[str, str]:
    return {
        "aws_access_key_id": FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "aws_session_token": FAKE_CREDENTIALS["AWS_SESSION_TOKEN"],
    }


def _zip(folder: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                z.write(p, p.relative_to(folder))
    return buf.getvalue()


def deploy(
    endpoint: str | None, parameters: dict[str, str], region: str = "us-east-1", timeout: float = 60.0
) -> DeployedStack:
    if endpoint is None:  # moto in this process: its DynamoDB writes made atomic, as DynamoDB's are
        atomic_dynamodb_writes()
    stack = DeployedStack(endpoint=endpoint, region=region, outputs={})
    s3 = stack.client("s3")
    s3.create_bucket(Bucket=CODE_BUCKET)
    template = load()
    folders = code_locations(template)
    for logical_id, folder in folders.items():
        s3.put_object(Bucket=CODE_BUCKET, Key=f"{logical_id}.zip", Body=_zip(REPO / folder))
    cfn = json.loads(_translated(stamp(), tuple(parameters.items()), region))
    stack.template, stack.parameters = cfn, dict(parameters)
    cf = stack.client("cloudformation")
    cf.create_stack(
        StackName=STACK,
        # moto reads a template as YAML first and as JSON only when that fails; read as YAML, this JSON
        # costs ~0.15 s of every deploy. A leading tab is JSON whitespace but no YAML token: straight to JSON.
        TemplateBody="\t" + json.dumps(cfn),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
    )
    deadline = time.monotonic() + timeout
    while True:
        st = cf.describe_stacks(StackName=STACK)["Stacks"][0]
        if not st["StackStatus"].endswith("IN_PROGRESS"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the stack did not finish creating in moto")
        time.sleep(0.1)
    if st["StackStatus"] != "CREATE_COMPLETE":
        raise RuntimeError(
            f"stack creation failed in moto: {st['StackStatus']} {st.get('StackStatusReason')}"
        )
    stack.outputs = {o["OutputKey"]: o["OutputValue"] for o in st.get("Outputs", [])}
    _bucket_notifications(stack, cf, cfn)

    physical = {
        r["LogicalResourceId"]: r.get("PhysicalResourceId", "")
        for r in cf.describe_stack_resources(StackName=STACK)["StackResources"]
        if "LogicalResourceId" in r
    }
    stack.created_directly = _what_moto_skips(stack, cfn, physical)
    lam = stack.client("lambda")
    mappings = lam.list_event_source_mappings()["EventSourceMappings"]
    for logical_id, folder in folders.items():
        if template["Resources"][logical_id]["Type"] != "AWS::Serverless::Function":
            continue
        conf = lam.get_function_configuration(FunctionName=physical[logical_id])
        fn = FunctionConfig(
            logical_id=logical_id,
            name=conf["FunctionName"],
            code_dir=REPO / folder,
            handler=conf["Handler"],
            environment={k: str(v) for k, v in conf.get("Environment", {}).get("Variables", {}).items()},
            memory_mb=int(conf.get("MemorySize", 128)),
            reserved_concurrency=lam.get_function_concurrency(FunctionName=conf["FunctionName"]).get(
                "ReservedConcurrentExecutions"
            ),
        )
        for m in mappings:
            if m["FunctionArn"].endswith(f":function:{fn.name}"):
                fn.queues[m["EventSourceArn"]] = int(m.get("BatchSize", 10))
                if "MaximumConcurrency" in (m.get("ScalingConfig") or {}):
                    fn.max_concurrency[m["EventSourceArn"]] = int(m["ScalingConfig"]["MaximumConcurrency"])
                if fn.queue_arn is None:
                    fn.queue_arn, fn.batch_size = m["EventSourceArn"], int(m.get("BatchSize", 10))
                # moto would try to run the function in Docker on every SendMessage (and count a
                # receive each time); the QueuePoller plays the mapping instead, with the same settings.
                lam.update_event_source_mapping(UUID=m["UUID"], Enabled=False)
        stack.functions[logical_id] = fn
    return stack


class _Resolver:
    """Resolves the intrinsics the skipped resources use (Ref, Fn::GetAtt, Fn::Sub, Fn::Join, Fn::If) against
    what moto created; parameters and conditions as `Intrinsics` evaluates them for the stack's parameters."""

    def __init__(self, stack: DeployedStack, cfn: dict[str, Any], physical: dict[str, str]) -> None:
        self.stack, self.cfn, self.physical = stack, cfn, physical
        self.intrinsics = Intrinsics(cfn, strict=False, **stack.parameters)

    def arn(self, logical: str) -> str:
        kind = self.cfn["Resources"][logical]["Type"]
        pid = self.physical[logical]
        if kind == "AWS::SQS::Queue":
            sqs = self.stack.client("sqs")
            return str(
                sqs.get_queue_attributes(QueueUrl=pid, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            )
        if kind == "AWS::Events::Rule":
            return (
                pid
                if pid.startswith("arn:")
                else str(self.stack.client("events").describe_rule(Name=pid)["Arn"])
            )
        if kind == "AWS::S3::Bucket":
            return f"arn:aws:s3:::{pid}"
        return pid

    def value(self, v: Any) -> Any:
        if isinstance(v, list):
            return [x for x in (self.value(x) for x in v) if x is not NO_VALUE]
        if not isinstance(v, dict):
            return v
        if "Ref" in v:
            if v["Ref"] == "AWS::NoValue":
                return NO_VALUE
            if v["Ref"] in self.intrinsics.params:
                return self.intrinsics.params[v["Ref"]]
            return {"AWS::AccountId": self.stack.account, "AWS::Region": self.stack.region}.get(
                v["Ref"], self.physical.get(v["Ref"], v["Ref"])
            )
        if "Fn::Join" in v:
            separator, parts = v["Fn::Join"]
            return separator.join(str(p) for p in self.value(parts))
        if "Fn::GetAtt" in v:
            logical, attr = v["Fn::GetAtt"]
            if attr == "QueueName":
                return self.physical[logical].rsplit("/", 1)[-1]
            return self.arn(logical)
        if "Fn::Sub" in v:
            text = v["Fn::Sub"] if isinstance(v["Fn::Sub"], str) else v["Fn::Sub"][0]
            return re.sub(
                r"\$\{([\w:]+)(?:\.(\w+))?\}",
                lambda m: str(self.value({"Fn::GetAtt": [m[1], m[2]]} if m[2] else {"Ref": m[1]})),
                text,
            )
        if "Fn::If" in v:
            name, then, otherwise = v["Fn::If"]
            return self.value(then if self.intrinsics.condition(name) else otherwise)
        resolved = {k: self.value(x) for k, x in v.items()}
        return {k: x for k, x in resolved.items() if x is not NO_VALUE}


def _what_moto_skips(stack: DeployedStack, cfn: dict[str, Any], physical: dict[str, str]) -> list[str]:
    """moto's CloudFormation accepts AWS::SQS::QueuePolicy, AWS::S3::BucketPolicy and
    AWS::CloudWatch::Alarm but creates nothing for them: create the queue policies and the alarms
    directly. The bucket policy is left out: moto's S3 enforces it, and its only statement denies
    requests without TLS, which every request to moto on 127.0.0.1 is."""
    r = _Resolver(stack, cfn, physical)
    done = []
    for logical, res in cfn["Resources"].items():
        props = res.get("Properties", {})
        if res["Type"] == "AWS::SQS::QueuePolicy":
            policy = json.dumps(r.value(props["PolicyDocument"]))
            for url in r.value(props["Queues"]):
                stack.client("sqs").set_queue_attributes(QueueUrl=url, Attributes={"Policy": policy})
        elif res["Type"] == "AWS::CloudWatch::Alarm":
            stack.client("cloudwatch").put_metric_alarm(
                AlarmName=f"{STACK}-{logical}",
                AlarmDescription=props.get("AlarmDescription", ""),
                Namespace=props["Namespace"],
                MetricName=props["MetricName"],
                Dimensions=r.value(props.get("Dimensions", [])),
                Statistic=props["Statistic"],
                Period=int(props["Period"]),
                EvaluationPeriods=int(props["EvaluationPeriods"]),
                Threshold=float(props["Threshold"]),
                ComparisonOperator=props["ComparisonOperator"],
                TreatMissingData=props.get("TreatMissingData", "missing"),
                AlarmActions=r.value(props.get("AlarmActions", [])),
            )
        else:
            continue
        done.append(logical)
    return done


def _bucket_notifications(stack: DeployedStack, cf: Any, cfn: dict[str, Any]) -> None:
    """moto's CloudFormation creates a bucket without its NotificationConfiguration; moto's S3 does send
    Object Created events to EventBridge once the configuration is put directly, so it is put here."""
    s3 = stack.client("s3")
    for r in cf.describe_stack_resources(StackName=STACK)["StackResources"]:
        res = cfn["Resources"].get(r.get("LogicalResourceId", ""), {})
        conf = res.get("Properties", {}).get("NotificationConfiguration", {})
        if res.get("Type") == "AWS::S3::Bucket" and "EventBridgeConfiguration" in conf:
            s3.put_bucket_notification_configuration(
                Bucket=r["PhysicalResourceId"], NotificationConfiguration={"EventBridgeConfiguration": {}}
            )


@functools.lru_cache(maxsize=8)
def _translated(template_stamp: tuple[int, int], parameters: tuple[tuple[str, str], ...], region: str) -> str:
    """The translated template as moto gets it, as JSON; translated again only when the template file
    or the parameters change (every stack a test deploys would otherwise translate it anew)."""
    return json.dumps(_without_conditional_policies(translate(load(), dict(parameters), region=region)))


def _without_conditional_policies(cfn: dict[str, Any]) -> dict[str, Any]:
    """moto's IAM fails on `Fn::If [cond, policy, AWS::NoValue]` in a role's Policies. moto enforces no
    IAM anyway, so locally every such policy is kept as if its condition held."""
    for res in cfn.get("Resources", {}).values():
        if res.get("Type") != "AWS::IAM::Role":
            continue
        policies = res.get("Properties", {}).get("Policies", [])
        res["Properties"]["Policies"] = [
            p["Fn::If"][1] if isinstance(p, dict) and "Fn::If" in p else p for p in policies
        ]
    return cfn
