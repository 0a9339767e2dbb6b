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


# ---------------------------------------------------------------------------------------- intrinsics
# The intrinsics the templates use, evaluated as CloudFormation would for given parameters: the template
# tests read policies, environments and the GPU cluster's resources through it, and the local stack's IAM
# guard (iam.py) the statements each function's role holds.
NO_VALUE = object()  # AWS::NoValue: the key or list item is left out
PSEUDO = {
    "AWS::Partition": "aws",
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "123456789012",
    "AWS::StackName": "spotguard",
    "AWS::URLSuffix": "amazonaws.com",
}


class Intrinsics:
    """A template's values for given parameters: Ref, Fn::GetAtt (placeholders `<Resource.Attribute>`),
    Join, Split, Select, Sub, If, Equals, Not, And, Or, Condition, Base64 (left decoded). `strict`
    evaluates both branches of every Fn::If, as a check that neither can fail (an index out of range)
    whatever CloudFormation evaluates."""

    def __init__(
        self,
        template: dict[str, Any],
        strict: bool = True,
        pseudo: dict[str, str] | None = None,
        **params: str,
    ) -> None:
        self.t, self.strict = template, strict
        self.pseudo = {**PSEUDO, **(pseudo or {})}
        self.params: dict[str, Any] = {}
        for name, p in template.get("Parameters", {}).items():
            value = params.get(name, p.get("Default"))
            assert value is not None, f"parameter {name} needs a value"
            listy = p["Type"] == "CommaDelimitedList" or p["Type"].startswith("List<")
            self.params[name] = str(value).split(",") if listy else str(value)
        self._conditions: dict[str, bool] = {}

    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            self._conditions[name] = bool(self(self.t["Conditions"][name]))
        return self._conditions[name]

    def resource(self, logical_id: str) -> dict[str, Any]:
        return self(self.t["Resources"][logical_id].get("Properties", {}))

    def _ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.params:
            return self.params[name]
        res = self.t["Resources"][name]
        props = res.get("Properties", {})
        if res["Type"] == "AWS::ECS::Cluster":
            return self(props["ClusterName"])
        if res["Type"] == "AWS::ECS::CapacityProvider":
            return self(props["Name"])
        return f"<{name}>"

    def _sub(self, text: str, names: dict[str, Any]) -> str:
        def one(m: re.Match[str]) -> str:
            key = m.group(1)
            if key.startswith("!"):
                return "${" + key[1:] + "}"
            if key in names:
                return str(names[key])
            if "." in key:
                return f"<{key}>"
            value = self._ref(key)
            assert isinstance(value, str), f"${{{key}}} is not a string"
            return value

        return re.sub(r"\$\{([^}]+)\}", one, text)

    def __call__(self, node: Any) -> Any:
        if isinstance(node, list):
            return [v for v in (self(x) for x in node) if v is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((fn, arg),) = node.items()
            if fn == "Ref":
                return self._ref(arg)
            if fn == "Condition":
                return self.condition(arg)
            if fn == "Fn::GetAtt":
                return f"<{'.'.join(arg) if isinstance(arg, list) else arg}>"
            if fn == "Fn::If":
                name, yes, no = arg
                chosen = self(yes) if self.condition(name) else self(no)
                if self.strict:
                    self(no if self.condition(name) else yes)
                return chosen
            if fn == "Fn::Join":
                return arg[0].join(self(arg[1]))
            if fn == "Fn::Split":
                return self(arg[1]).split(arg[0])
            if fn == "Fn::Select":
                return self(arg[1])[int(self(arg[0]))]  # IndexError, as CloudFormation fails
            if fn == "Fn::Sub":
                text, names = (arg, {}) if isinstance(arg, str) else (arg[0], self(arg[1]))
                return self._sub(text, names)
            if fn == "Fn::Base64":
                return self(arg)
            if fn == "Fn::Equals":
                a, b = self(arg)
                return a == b
            if fn == "Fn::Not":
                return not self(arg[0])
            if fn == "Fn::And":
                return all(self(x) for x in arg)
            if fn == "Fn::Or":
                return any(self(x) for x in arg)
            assert not fn.startswith("Fn::"), f"the evaluator does not know {fn}"
        return {k: v for k, v in ((k, self(v)) for k, v in node.items()) if v is not NO_VALUE}


def resolve(
    cfn: dict[str, Any],
    value: Any,
    parameters: dict[str, str] | None = None,
    pseudo: dict[str, str] | None = None,
) -> Any:
    """`value` as CloudFormation evaluates it for `parameters` (the others at their defaults)."""
    return Intrinsics(cfn, strict=False, pseudo=pseudo, **(parameters or {}))(value)
