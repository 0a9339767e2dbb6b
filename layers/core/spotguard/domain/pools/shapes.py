"""The AWS answers discovery reads (ECS's capacity providers, Auto Scaling's groups, EC2's launch
templates, subnets and instance types): the parts it needs, by their API names; the rest is ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


# ==================================================================================== the API shapes
class _Api(BaseModel):
    """A part of an AWS answer, read by its API names (aliases); whatever else it holds is ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class EcsTag(_Api):
    key: str
    value: str = ""


class AsgProvider(_Api):
    auto_scaling_group_arn: str = Field(alias="autoScalingGroupArn")


class CapacityProvider(_Api):
    """DescribeCapacityProviders' `capacityProviders[]` (asked with include=["TAGS"])."""

    name: str
    status: str = "ACTIVE"
    auto_scaling_group_provider: AsgProvider | None = Field(None, alias="autoScalingGroupProvider")
    tags: tuple[EcsTag, ...] = ()

    def tag(self, key: str) -> str | None:
        return next((t.value for t in self.tags if t.key == key), None)

    @property
    def group_name(self) -> str | None:
        """The group's name: ECS answers its ARN (…:autoScalingGroupName/<name>), or the name given."""
        if self.auto_scaling_group_provider is None:
            return None
        arn = self.auto_scaling_group_provider.auto_scaling_group_arn
        return arn.split(":autoScalingGroupName/", 1)[1] if ":autoScalingGroupName/" in arn else arn


class LaunchTemplateSpec(_Api):
    template_id: str | None = Field(None, alias="LaunchTemplateId")
    template_name: str | None = Field(None, alias="LaunchTemplateName")
    version: str | None = Field(None, alias="Version")

    @property
    def ref(self) -> tuple[str, str]:
        """(by what, which) for DescribeLaunchTemplateVersions: ("id", id) or ("name", name)."""
        return ("id", self.template_id) if self.template_id else ("name", self.template_name or "")


class Override(_Api):
    instance_type: str | None = Field(None, alias="InstanceType")
    launch_template: LaunchTemplateSpec | None = Field(None, alias="LaunchTemplateSpecification")


class MixedTemplate(_Api):
    spec: LaunchTemplateSpec = Field(alias="LaunchTemplateSpecification")
    overrides: tuple[Override, ...] = Field((), alias="Overrides")


class Distribution(_Api):
    """InstancesDistribution, with the API's defaults (base 0, 100 % on-demand above it)."""

    on_demand_base: int = Field(0, alias="OnDemandBaseCapacity")
    on_demand_percent: int = Field(100, alias="OnDemandPercentageAboveBaseCapacity")


class MixedPolicy(_Api):
    launch_template: MixedTemplate = Field(alias="LaunchTemplate")
    distribution: Distribution = Field(Distribution(), alias="InstancesDistribution")


class AutoScalingGroup(_Api):
    """DescribeAutoScalingGroups' `AutoScalingGroups[]`."""

    name: str = Field(alias="AutoScalingGroupName")
    launch_template: LaunchTemplateSpec | None = Field(None, alias="LaunchTemplate")
    mixed: MixedPolicy | None = Field(None, alias="MixedInstancesPolicy")
    launch_configuration: str | None = Field(None, alias="LaunchConfigurationName")
    subnets: str = Field("", alias="VPCZoneIdentifier")  # comma-separated subnet ids
    zones: tuple[str, ...] = Field((), alias="AvailabilityZones")
    max_size: int | None = Field(None, alias="MaxSize", ge=0)

    @property
    def subnet_ids(self) -> list[str]:
        return [s.strip() for s in self.subnets.split(",") if s.strip()]

    def templates(self) -> list[LaunchTemplateSpec]:
        """The launch templates whose data discovery needs: the group's own when it has no mixed policy
        (type and market), or the mixed policy's when it overrides no instance type (type only)."""
        if self.mixed is None:
            return [self.launch_template] if self.launch_template else []
        if not any(o.instance_type for o in self.mixed.launch_template.overrides):
            return [self.mixed.launch_template.spec]
        return []


class MarketOptions(_Api):
    market_type: str | None = Field(None, alias="MarketType")


class TemplateData(_Api):
    instance_type: str | None = Field(None, alias="InstanceType")
    market: MarketOptions | None = Field(None, alias="InstanceMarketOptions")


class TemplateVersion(_Api):
    """DescribeLaunchTemplateVersions' `LaunchTemplateVersions[]`."""

    template_id: str = Field(alias="LaunchTemplateId")
    template_name: str = Field("", alias="LaunchTemplateName")
    version: int = Field(alias="VersionNumber")
    default: bool = Field(False, alias="DefaultVersion")
    data: TemplateData = Field(TemplateData(), alias="LaunchTemplateData")


class Subnet(_Api):
    subnet_id: str = Field(alias="SubnetId")
    zone: str = Field(alias="AvailabilityZone")
    zone_id: str | None = Field(None, alias="AvailabilityZoneId")


class Gpu(_Api):
    count: int = Field(0, alias="Count")


class GpuInfo(_Api):
    gpus: tuple[Gpu, ...] = Field((), alias="Gpus")


class InstanceTypeInfo(_Api):
    """DescribeInstanceTypes' `InstanceTypes[]`: a type without GpuInfo has no GPU."""

    instance_type: str = Field(alias="InstanceType")
    gpu_info: GpuInfo | None = Field(None, alias="GpuInfo")

    @property
    def gpus(self) -> int:
        return sum(g.count for g in self.gpu_info.gpus) if self.gpu_info else 0
