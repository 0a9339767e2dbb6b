"""examples/gpu-cluster: the GPU spot cluster SpotGuard is meant for. cfn-lint clean, and built the way
SpotGuard needs it (the ECS agent's settings, spot pools, the terminate hook SpotGuard answers, capacity
providers on the cluster, the AMI from its SSM parameter). Where the templates compute values from
parameters, the values are worked out here with a small evaluator of CloudFormation's functions."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cfnlint.api import ManualArgs, lint_file
from cfnlint.decode import decode

from spotguard_cli.emulator.template import Intrinsics

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "examples" / "gpu-cluster"
CLUSTER = HERE / "cluster.yaml"
FLEET = HERE / "spot-fleet.yaml"
GPU_AMI = "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
NETWORK = {"VpcId": "vpc-0123", "Subnets": "subnet-a,subnet-b,subnet-c"}
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
PROVIDER = "AWS::ECS::CapacityProvider"


def _load(path: Path) -> dict[str, Any]:
    template, errors = decode(str(path))
    assert not errors, errors
    return template


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    return _load(CLUSTER)


@pytest.fixture(scope="module")
def fleet() -> dict[str, Any]:
    return _load(FLEET)


def Stack(template: dict[str, Any], strict: bool = True, **params: str) -> Intrinsics:
    """The GPU cluster template's values for `params` (both branches of every Fn::If checked)."""
    return Intrinsics(template, strict=strict, pseudo={"AWS::StackName": "gpu-cluster"}, **params)


def _of_type(template: dict[str, Any], kind: str) -> dict[str, Any]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def _types(group: dict[str, Any]) -> list[str]:
    return [o["InstanceType"] for o in group["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]]


def _pool(group: dict[str, Any]) -> str:
    return next(t["Value"] for t in group["Tags"] if t["Key"] == "spotguard:pool")


# --------------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("path", [CLUSTER, FLEET], ids=lambda p: p.name)
def test_cfn_lint_is_clean(path):
    """No error, warning or informational finding."""
    matches = lint_file(path, config=ManualArgs(include_checks=["I"]))
    assert [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in matches] == []


def test_the_amis_come_from_the_public_ssm_parameters(cluster):
    params = cluster["Parameters"]
    images = {}
    for name, lt in _of_type(cluster, "AWS::EC2::LaunchTemplate").items():
        ref = lt["Properties"]["LaunchTemplateData"]["ImageId"]
        assert set(ref) == {"Ref"}, name
        assert params[ref["Ref"]]["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
        images[name] = params[ref["Ref"]]["Default"]
    assert images["GpuLaunchTemplate"] == GPU_AMI
    assert images["CpuLaunchTemplate"].startswith("/aws/service/ecs/optimized-ami/amazon-linux-2023/")


def _ecs_config(user_data: str) -> dict[str, str]:
    """The lines the user data appends to /etc/ecs/ecs.config (a quoted heredoc: nothing expands)."""
    m = re.search(r"cat >> /etc/ecs/ecs\.config <<'EOF'\n(.*?)\nEOF\n", user_data, re.S)
    assert m, user_data
    return dict(line.split("=", 1) for line in m.group(1).splitlines())


def test_the_gpu_user_data_configures_the_ecs_agent(cluster):
    stack = Stack(cluster, **NETWORK)
    user_data = stack.resource("GpuLaunchTemplate")["LaunchTemplateData"]["UserData"]
    assert user_data.startswith("#!/bin/bash\n")
    config = _ecs_config(user_data)
    assert config["ECS_CLUSTER"] == "gpu-spot" == stack(cluster["Outputs"]["ClusterName"]["Value"])
    assert config["ECS_ENABLE_GPU_SUPPORT"] == "true"
    assert config["ECS_ENABLE_SPOT_INSTANCE_DRAINING"] == "true"
    # Long enough for the example jobs' checkpoint window (their own stopTimeout takes precedence).
    stop = re.fullmatch(r"(\d+)s", config["ECS_CONTAINER_STOP_TIMEOUT"])
    assert stop
    windows = [
        c["stopTimeout"]
        for f in (REPO / "examples" / "taskdefs").glob("*.json")
        for c in json.loads(f.read_text())["containerDefinitions"]
        if "stopTimeout" in c
    ]
    assert windows and int(stop.group(1)) >= max(windows)
    cpu = _ecs_config(stack.resource("CpuLaunchTemplate")["LaunchTemplateData"]["UserData"])
    assert cpu["ECS_CLUSTER"] == "gpu-spot" and cpu["ECS_ENABLE_SPOT_INSTANCE_DRAINING"] == "true"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_user_data_is_valid_bash(cluster):
    stack = Stack(cluster, **NETWORK)
    templates = _of_type(cluster, "AWS::EC2::LaunchTemplate")
    assert sorted(templates) == ["CpuLaunchTemplate", "GpuLaunchTemplate"]  # none would check nothing
    for name in templates:
        script = stack.resource(name)["LaunchTemplateData"]["UserData"]
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_instances_require_imdsv2_encrypt_their_root_volume_and_can_be_signalled_over_ssm(cluster):
    stack = Stack(cluster, **NETWORK)
    templates = _of_type(cluster, "AWS::EC2::LaunchTemplate")
    assert sorted(templates) == ["CpuLaunchTemplate", "GpuLaunchTemplate"]  # none would check nothing
    for name in templates:
        data = stack.resource(name)["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required", name
        assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 2, name  # the agent in a container
        (root,) = data["BlockDeviceMappings"]
        assert root["DeviceName"] == "/dev/xvda" and root["Ebs"]["Encrypted"] is True, name
        assert data["IamInstanceProfile"] == {"Arn": "<InstanceProfile.Arn>"}
    policies = stack.resource("InstanceRole")["ManagedPolicyArns"]
    assert sorted(p.rsplit("/", 1)[1] for p in policies) == [
        "AmazonEC2ContainerServiceforEC2Role",
        "AmazonSSMManagedInstanceCore",
    ]
    assert stack.resource("InstanceProfile")["Roles"] == ["<InstanceRole>"]


def test_every_gpu_group_is_spot_with_price_capacity_optimized_or_on_demand(cluster):
    stack = Stack(cluster, **NETWORK)
    spot, on_demand = {}, {}
    for name in _of_type(cluster, "AWS::AutoScaling::AutoScalingGroup"):
        group = stack.resource(name)
        assert group["VPCZoneIdentifier"] == NETWORK["Subnets"].split(","), name  # every zone
        assert group["MinSize"] == "0", name  # managed scaling adds instances
        policy = group["MixedInstancesPolicy"]
        template = policy["LaunchTemplate"]["LaunchTemplateSpecification"]["LaunchTemplateId"]
        if template != "<GpuLaunchTemplate>":
            continue
        dist = policy["InstancesDistribution"]
        if dist["OnDemandPercentageAboveBaseCapacity"] == 0:
            assert dist["SpotAllocationStrategy"] == "price-capacity-optimized", name
            assert dist["OnDemandBaseCapacity"] == 0, name
            assert group["CapacityRebalance"] is True, name
            spot[_pool(group)] = _types(group)
        else:
            assert dist["OnDemandPercentageAboveBaseCapacity"] == 100, name
            assert not group.get("CapacityRebalance"), name
            on_demand[_pool(group)] = _types(group)
    assert spot == {
        "gpu1-spot": ["g5.xlarge", "g6.xlarge"],
        "gpu4-spot": ["g5.12xlarge", "g6.12xlarge"],
        "gpu8-spot": ["g5.48xlarge", "p4d.24xlarge"],
    }
    # The on-demand groups exist, one per GPU size, with the spot pool's instance types.
    assert on_demand == {k.replace("-spot", "-ondemand"): v for k, v in spot.items()}


def test_every_group_has_the_terminate_hook_spotguard_answers(cluster):
    params = cluster["Parameters"]
    groups = _of_type(cluster, "AWS::AutoScaling::AutoScalingGroup")
    assert len(groups) == 7
    for name, group in groups.items():
        hooks = [
            h
            for h in group["Properties"]["LifecycleHookSpecificationList"]
            if h["LifecycleTransition"] == TERMINATING
        ]
        assert len(hooks) == 1, name
        (hook,) = hooks
        assert hook["DefaultResult"] == "CONTINUE", name
        # No notification target: the event goes to EventBridge's default bus, where SpotGuard's rule is.
        assert "NotificationTargetARN" not in hook and "RoleARN" not in hook, name
        timeout = params[hook["HeartbeatTimeout"]["Ref"]]
        # Longer than a checkpoint window, with room to spare.
        assert timeout["Default"] >= params["ContainerStopTimeoutSeconds"]["Default"] + 60
        assert timeout["MinValue"] >= 60


def test_spotguard_takes_the_hooks_events_and_may_signal_the_instances(cluster):
    """Against SpotGuard's own template: its rule matches the hook's events, and whatever resource tag its
    ssm:SendCommand grant may come to require, the instances carry."""
    spotguard, errors = decode(str(REPO / "template.yaml"))
    assert not errors
    rules = [
        r["Properties"]["EventPattern"]
        for r in _of_type(spotguard, "AWS::Events::Rule").values()
        if "EC2 Instance-terminate Lifecycle Action" in r["Properties"]["EventPattern"].get("detail-type", [])
    ]
    assert len(rules) == 1
    (pattern,) = rules
    assert pattern["source"] == ["aws.autoscaling"]
    detail = pattern.get("detail", {})
    hook_names = {
        h["LifecycleHookName"]
        for g in _of_type(cluster, "AWS::AutoScaling::AutoScalingGroup").values()
        for h in g["Properties"]["LifecycleHookSpecificationList"]
    }
    assert hook_names == {"spotguard-drain"}
    if "LifecycleHookName" in detail:  # a prefix match on the LifecycleHookPrefix parameter
        (match,) = detail["LifecycleHookName"]
        prefix = spotguard["Parameters"]["LifecycleHookPrefix"]["Default"]
        assert match == {"prefix": {"Ref": "LifecycleHookPrefix"}}
        assert all(name.startswith(prefix) for name in hook_names)
    if "LifecycleTransition" in detail:
        assert TERMINATING in detail["LifecycleTransition"]
    assert "AutoScalingGroupName" not in detail  # any group (CloudFormation names ours)

    required = _send_command_tag_conditions(spotguard)
    assert required is not None, "SpotGuard no longer sends SSM commands: revisit the instance role"
    tags = _instance_tags(cluster)
    for key, value in required:
        assert key in tags, f"the instances lack the tag {key} that ssm:SendCommand requires"
        if value is not None:
            assert tags[key] == value, key


def _instance_tags(cluster: dict[str, Any]) -> dict[str, str]:
    data = Stack(cluster, **NETWORK).resource("GpuLaunchTemplate")["LaunchTemplateData"]
    return {
        t["Key"]: t["Value"]
        for spec in data["TagSpecifications"]
        if spec["ResourceType"] == "instance"
        for t in spec["Tags"]
    }


def _send_command_tag_conditions(template: dict[str, Any]) -> list[tuple[str, str | None]] | None:
    """The resource tags (key, literal value or None) that the template's ssm:SendCommand grants make a
    condition of; None when it grants no ssm:SendCommand at all."""
    statements: list[dict[str, Any]] = []

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            actions = node.get("Action", [])
            actions = actions if isinstance(actions, list) else [actions]
            if node.get("Effect") == "Allow" and "ssm:SendCommand" in actions:
                statements.append(node)
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    collect(template.get("Resources", {}))
    if not statements:
        return None
    found: list[tuple[str, str | None]] = []
    for statement in statements:
        for keys in statement.get("Condition", {}).values():
            for key, value in keys.items():
                m = re.fullmatch(r"(?:aws|ssm|ec2):[Rr]esource[Tt]ag/(.+)", key)
                if m:
                    literal = isinstance(value, str) and not any(c in value for c in "$*?")
                    found.append((m.group(1), value if literal else None))
    return found


def test_the_tag_check_reads_a_tag_condition_on_send_command():
    """The check above, on a grant that does condition on a tag (SpotGuard's does not, today)."""
    statement = {
        "Effect": "Allow",
        "Action": ["ssm:SendCommand"],
        "Resource": "*",
        "Condition": {"StringEquals": {"ssm:resourceTag/spotguard:cluster": "gpu-spot"}},
    }
    grant = {"Resources": {"Fn": {"Properties": {"Policies": [{"Statement": [statement]}]}}}}
    assert _send_command_tag_conditions(grant) == [("spotguard:cluster", "gpu-spot")]
    assert _send_command_tag_conditions({"Resources": {}}) is None


def test_capacity_providers_are_associated_with_the_cluster(cluster):
    providers = _of_type(cluster, PROVIDER)
    groups = _of_type(cluster, "AWS::AutoScaling::AutoScalingGroup")
    (assoc,) = _of_type(cluster, "AWS::ECS::ClusterCapacityProviderAssociations").values()
    assert assoc["Properties"]["Cluster"] == {"Ref": "Cluster"}
    assert sorted(r["Ref"] for r in assoc["Properties"]["CapacityProviders"]) == sorted(providers)
    default = assoc["Properties"]["DefaultCapacityProviderStrategy"]
    assert [s["CapacityProvider"] for s in default] == [{"Ref": "CpuCapacityProvider"}]
    used = []
    for name, provider in providers.items():
        asg = provider["Properties"]["AutoScalingGroupProvider"]
        group = asg["AutoScalingGroupArn"]["Ref"]
        used.append(group)
        assert asg["ManagedScaling"]["Status"] == "ENABLED", name
        assert asg["ManagedTerminationProtection"] == "ENABLED", name
        assert groups[group]["Properties"]["NewInstancesProtectedFromScaleIn"] is True, name
        # ECS's own terminate hook would be completed early by SpotGuard: the spotguard-drain hook drains.
        assert asg["ManagedDraining"] == "DISABLED", name
    assert sorted(used) == sorted(groups)  # one provider per group


def test_outputs_name_the_cluster_and_every_capacity_provider(cluster):
    stack = Stack(cluster, **NETWORK)
    outputs = {k: stack(v["Value"]) for k, v in cluster["Outputs"].items()}
    assert outputs["ClusterName"] == "gpu-spot"
    providers = {stack(p["Properties"]["Name"]) for p in _of_type(cluster, PROVIDER).values()}
    assert providers == {
        "gpu-spot-gpu1-spot",
        "gpu-spot-gpu1-ondemand",
        "gpu-spot-gpu4-spot",
        "gpu-spot-gpu4-ondemand",
        "gpu-spot-gpu8-spot",
        "gpu-spot-gpu8-ondemand",
        "gpu-spot-cpu",
    }
    assert providers <= set(outputs.values())
    network = json.loads(outputs["TaskNetworkConfiguration"])
    assert network["awsvpcConfiguration"]["subnets"] == ["subnet-a", "subnet-b", "subnet-c"]
    assert network["awsvpcConfiguration"]["securityGroups"] == ["<TaskSecurityGroup>"]
    assert outputs["GpuLaunchTemplateId"] == "<GpuLaunchTemplate>"


@pytest.mark.parametrize("types", ["g5.xlarge", "g5.xlarge,g6.xlarge", "g5.xlarge,g6.xlarge,g4dn.xlarge"])
def test_a_pool_takes_one_to_three_instance_types(cluster, types):
    stack = Stack(cluster, strict=True, Gpu1InstanceTypes=types, **NETWORK)
    for name in ("Gpu1SpotGroup", "Gpu1OnDemandGroup"):
        assert _types(stack.resource(name)) == types.split(","), name


@pytest.mark.parametrize("subnets", ["subnet-a", "subnet-a,subnet-b", "subnet-a,subnet-b,subnet-c"])
@pytest.mark.parametrize(
    "types", ["g5.12xlarge", "g5.12xlarge,g6.12xlarge", "g5.12xlarge,g6.12xlarge,p3.8xlarge"]
)
def test_the_spot_fleet_launches_every_type_in_every_subnet_from_the_launch_template(fleet, types, subnets):
    stack = Stack(
        fleet,
        strict=True,
        LaunchTemplateId="lt-0123456789abcdef0",
        LaunchTemplateVersion="3",
        Subnets=subnets,
        FleetInstanceTypes=types,
    )
    config = stack.resource("SpotFleet")["SpotFleetRequestConfigData"]
    (lt,) = config["LaunchTemplateConfigs"]
    assert lt["LaunchTemplateSpecification"] == {"LaunchTemplateId": "lt-0123456789abcdef0", "Version": "3"}
    pairs = [(o["InstanceType"], o["SubnetId"]) for o in lt["Overrides"]]
    assert sorted(pairs) == sorted((t, s) for t in types.split(",") for s in subnets.split(","))
    assert config["AllocationStrategy"] == "priceCapacityOptimized"
    assert config["Type"] == "maintain"
    assert config["ExcessCapacityTerminationPolicy"] == "noTermination"
    rebalance = config["SpotMaintenanceStrategies"]["CapacityRebalance"]
    assert rebalance["ReplacementStrategy"] == "launch-before-terminate"
    assert config["IamFleetRole"] == "<SpotFleetRole.Arn>"
    role = stack.resource("SpotFleetRole")
    assert role["ManagedPolicyArns"] == ["arn:aws:iam::aws:policy/service-role/AmazonEC2SpotFleetTaggingRole"]


def test_the_readme_describes_every_parameter_and_output(cluster, fleet):
    readme = (HERE / "README.md").read_text()
    names = [*cluster["Parameters"], *cluster["Outputs"], *fleet["Parameters"]]
    assert [n for n in names if f"`{n}`" not in readme] == []
