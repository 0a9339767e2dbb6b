"""What a job is submitted with: the RunTask request, in ECS's own names (less the tags SpotGuard sets
itself), and the job's options, EBS mode's among them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from spotguard.domain.tasks import CHECKPOINT_CONTAINER_TAG, JOB_TAG

ATTEMPT_TAG = "spotguard:attempt"
NODE_TAG = "spotguard:node"
MAX_NODES = 64


# --------------------------------------------------------------------------------- the RunTask request
class Tag(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = Field(min_length=1, max_length=128)
    value: str = Field(default="", max_length=256)


class CapacityProviderItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    capacityProvider: str = Field(min_length=1, max_length=255)
    weight: int | None = Field(default=None, ge=0, le=1000)
    base: int | None = Field(default=None, ge=0, le=100000)


class RunTaskRequest(BaseModel):
    """The part of an ECS RunTask request a job is made of, in the API's own (camelCase) names, so a
    request that works with `aws ecs run-task` works here. SpotGuard sets count (1), startedBy and
    clientToken itself; a request that sets them is refused rather than silently changed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cluster: str = Field(min_length=1, max_length=2048)
    taskDefinition: str = Field(min_length=1, max_length=2048)
    overrides: dict[str, Any] | None = None
    launchType: Literal["EC2", "FARGATE", "EXTERNAL"] | None = None
    capacityProviderStrategy: list[CapacityProviderItem] | None = Field(default=None, max_length=20)
    networkConfiguration: dict[str, Any] | None = None
    placementConstraints: list[dict[str, Any]] | None = Field(default=None, max_length=10)
    placementStrategy: list[dict[str, Any]] | None = Field(default=None, max_length=5)
    platformVersion: str | None = None
    tags: list[Tag] | None = Field(default=None, max_length=40)
    propagateTags: Literal["TASK_DEFINITION", "SERVICE", "NONE"] | None = None
    group: str | None = Field(default=None, max_length=255)
    enableExecuteCommand: bool | None = None
    enableECSManagedTags: bool | None = None
    volumeConfigurations: list[dict[str, Any]] | None = None
    count: Literal[1] = 1

    @model_validator(mode="after")
    def _one_placement_kind(self) -> RunTaskRequest:
        if self.launchType and self.capacityProviderStrategy:
            raise ValueError("give either launchType or capacityProviderStrategy, not both")
        for t in self.tags or []:
            if t.key.startswith("aws:"):
                raise ValueError(f"tag {t.key!r}: keys starting with aws: are reserved")
            if t.key in (JOB_TAG, ATTEMPT_TAG, NODE_TAG, CHECKPOINT_CONTAINER_TAG):
                raise ValueError(f"tag {t.key!r} is set by SpotGuard")
        return self

    @property
    def cluster_name(self) -> str:
        return self.cluster.rsplit("/", 1)[-1]

    @property
    def fargate(self) -> bool:
        if self.launchType == "FARGATE":
            return True
        return any(
            c.capacityProvider in ("FARGATE", "FARGATE_SPOT") for c in self.capacityProviderStrategy or []
        )


class EbsOptions(BaseModel):
    """EBS mode: the managed volume each attempt gets (from the newest snapshot, once there is one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    size_gib: int = Field(default=100, ge=1, le=16384)
    volume_type: Literal["gp3", "gp2", "io1", "io2", "st1", "sc1"] = "gp3"
    filesystem: Literal["ext3", "ext4", "xfs"] = "ext4"
    iops: int | None = Field(default=None, ge=100, le=256000)
    throughput: int | None = Field(default=None, ge=125, le=2000)
    kms_key_id: str | None = Field(default=None, min_length=1, max_length=2048)
    # the role ECS manages the volume with; None: the stack's own (EbsVolumesRole)
    role_arn: str | None = Field(default=None, pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
    keep_snapshots: int = Field(default=2, ge=1, le=20)


class JobOptions(BaseModel):
    # Numbers are strict: `true`, "2" and 2.0 are not a count of nodes (the job spec's fields are the same)
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_attempts: int = Field(default=20, ge=1, le=100, strict=True)
    max_error_retries: int = Field(default=0, ge=0, le=20, strict=True)
    # s3: the agent commits to S3; ebs: to the task's managed EBS volume, which SpotGuard snapshots
    # when the task stops and gives to the next attempt (the task definition needs a volume
    # `configuredAtLaunch`). None: ebs when the task definition has such a volume that the checkpoint
    # container mounts and the request does not configure it, else s3.
    checkpoint_mode: Literal["s3", "ebs"] | None = None
    ebs: EbsOptions | None = None
    # At submit: after now and at most MAX_DEADLINE_HOURS (a year) from now.
    deadline: AwareDatetime | None = None
    # After an interruption the next attempt stays off the instance for good, and off its spot pool
    # (instance type in that availability zone) for this long.
    avoid_pool_seconds: int = Field(default=1800, ge=0, le=7 * 86400, strict=True)
    # The container that runs the agent (gets SIGUSR1); None = the first in the task definition.
    checkpoint_container: str | None = Field(default=None, min_length=1, max_length=255)
    # Capacity (docs/capacity.md, "Pools, decisions and moves"). auto: when the cluster has pools, the
    # capacity policy chooses each launch's pool (spot or on-demand) or a wait, and may move a job with a
    # deadline; fixed: every launch is the request as submitted.
    capacity: Literal["auto", "fixed"] = "auto"
    # The user's estimate of the whole job's work, in hours of running; replaced by the measured rate of
    # progress once two checkpoints of one attempt exist.
    work_hours: float | None = Field(default=None, gt=0, le=10000, strict=True)
    # Moves of a running job to other capacity (to on-demand to keep its deadline, back to spot when it
    # pays): at most this many, and never two within `min_move_interval_seconds`.
    max_moves: int = Field(default=4, ge=0, le=20, strict=True)
    min_move_interval_seconds: int = Field(default=3600, ge=0, le=7 * 86400, strict=True)
    # A task of a pool still PROVISIONING (no instance for it) this long: the pool has no capacity now;
    # the task is stopped and the job launched again where the policy says.
    provisioning_timeout_seconds: int = Field(default=600, ge=60, le=86400, strict=True)
    # A multi-node job (a gang): this many tasks of the request, one per instance, in one pool, started
    # together and relaunched together (docs/jobs.md, "Multi-node jobs"). An attempt that cannot place
    # all of them within `provisioning_timeout_seconds` is stopped and tried again.
    nodes: int = Field(default=1, ge=1, le=MAX_NODES, strict=True)
    # the port node 0 hosts the rendezvous on (torchrun's --master-port)
    rendezvous_port: int = Field(default=29500, ge=1024, le=65535, strict=True)
