"""Read template.yaml and translate it with aws-sam-translator, offline.

Used by the template tests and by the local stack, which creates the translated stack in moto's
CloudFormation so that what runs locally is exactly what the template says.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = REPO / "template.yaml"
CODE_BUCKET = "spotguard-code"

# The only AWS managed policies SAM attaches for this template (the SQS event source's poller rights,
# and the basic execution role); naming them here keeps translation off the network.
MANAGED_POLICIES = {
    "AWSLambdaBasicExecutionRole": "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
    "AWSLambdaSQSQueueExecutionRole": "arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole",
    "AWSXrayWriteOnlyAccess": "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess",
    "AWSXRayDaemonWriteAccess": "arn:aws:iam::aws:policy/AWSXRayDaemonWriteAccess",
}


def load(path: Path = TEMPLATE) -> dict[str, Any]:
    """The template as a dict of its own (the caller may change it); parsed again only when the file
    changed, since every stack a test deploys reads it."""
    st = path.stat()
    return copy.deepcopy(_parse(path, st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=4)
def _parse(path: Path, mtime_ns: int, size: int) -> dict[str, Any]:
    from samtranslator.yaml_helper import yaml_parse  # imported when needed: the CLI starts fast

    return dict(yaml_parse(path.read_text()))


def stamp(path: Path = TEMPLATE) -> tuple[int, int]:
    """What changes when the template file does (its modification time and size)."""
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def code_locations(template: dict[str, Any]) -> dict[str, str]:
    """Logical id -> local folder of every function's CodeUri and layer's ContentUri."""
    out: dict[str, str] = {}
    for name, res in template.get("Resources", {}).items():
        props = res.get("Properties", {})
        if res.get("Type") == "AWS::Serverless::Function" and isinstance(props.get("CodeUri"), str):
            out[name] = props["CodeUri"]
        if res.get("Type") == "AWS::Serverless::LayerVersion" and isinstance(props.get("ContentUri"), str):
            out[name] = props["ContentUri"]
    return out


def translate(
    template: dict[str, Any] | None = None,
    parameters: dict[str, Any] | None = None,
    region: str = "us-east-1",
    bucket: str = CODE_BUCKET,
) -> dict[str, Any]:
    """The CloudFormation that SAM makes of the template; local code folders become s3://bucket/<id>.zip."""
    tpl = copy.deepcopy(template if template is not None else load())
    for name, res in tpl.get("Resources", {}).items():
        props = res.get("Properties", {})
        for key in ("CodeUri", "ContentUri"):
            if isinstance(props.get(key), str) and not props[key].startswith("s3://"):
                props[key] = f"s3://{bucket}/{name}.zip"
    from samtranslator.translator.managed_policy_translator import ManagedPolicyLoader
    from samtranslator.translator.transform import transform

    class OfflinePolicies(ManagedPolicyLoader):
        def __init__(self) -> None:
            pass

        def load(self) -> dict[str, str]:
            return dict(MANAGED_POLICIES)

    previous = os.environ.get("AWS_DEFAULT_REGION")
    os.environ["AWS_DEFAULT_REGION"] = region  # the translator reads the region from the environment
    try:
        return transform(tpl, dict(parameters or {}), OfflinePolicies())
    finally:
        if previous is None:
            os.environ.pop("AWS_DEFAULT_REGION", None)
        else:
            os.environ["AWS_DEFAULT_REGION"] = previous


# ------------------------------------------------------------------------------------------- resolve
# The intrinsics the template uses, evaluated as CloudFormation would for given parameters: the template
# tests read the policies' ARNs and the functions' environment through it, and the local stack's IAM
# guard (iam.py) the statements each function's role holds.
NO_VALUE = object()  # AWS::NoValue: the key or list item is left out
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": "us-east-1", "AWS::AccountId": "123456789012"}


def resolve(
    cfn: dict[str, Any], value: Any, parameters: dict[str, str] | None = None, pseudo: dict[str, str] = PSEUDO
) -> Any:
    """`value` with Ref, Fn::GetAtt (as `<Resource.Attribute>`), Fn::Join, Fn::Split, Fn::If, Fn::Equals,
    Fn::Not, Fn::And, Fn::Or and Fn::Sub evaluated; parameters not given take their defaults."""
    params: dict[str, Any] = {}
    for name, p in cfn.get("Parameters", {}).items():
        raw = (parameters or {}).get(name, p.get("Default", ""))
        params[name] = raw.split(",") if p["Type"] == "CommaDelimitedList" else raw

    def ref(name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        return pseudo.get(name, params.get(name, f"<{name}>"))

    def ev(v: Any) -> Any:
        if isinstance(v, list):
            return [x for x in map(ev, v) if x is not NO_VALUE]
        if not isinstance(v, dict):
            return v
        if len(v) == 1:
            ((fn, a),) = v.items()
            if fn == "Ref":
                return ref(a)
            if fn == "Condition":
                return ev(cfn["Conditions"][a])
            if fn == "Fn::GetAtt":
                return f"<{a[0]}.{a[1]}>"
            if fn == "Fn::Join":
                return a[0].join(ev(a[1]))
            if fn == "Fn::Split":
                return ev(a[1]).split(a[0])
            if fn == "Fn::If":
                return ev(a[1]) if ev(cfn["Conditions"][a[0]]) else ev(a[2])
            if fn == "Fn::Equals":
                return ev(a[0]) == ev(a[1])
            if fn == "Fn::Not":
                return not ev(a[0])
            if fn == "Fn::And":
                return all(ev(x) for x in a)
            if fn == "Fn::Or":
                return any(ev(x) for x in a)
            if fn == "Fn::Sub":
                text, names = (a, {}) if isinstance(a, str) else (a[0], ev(a[1]))

                def one(m: re.Match[str]) -> str:
                    key = m[1]
                    if key in names:
                        return str(names[key])
                    return f"<{key}>" if "." in key else str(ref(key))

                return re.sub(r"\$\{([^}]+)\}", one, text)
        return {k: x for k, x in ((k, ev(x)) for k, x in v.items()) if x is not NO_VALUE}

    return ev(value)
