"""The reconcile function's check of a checkpoint bucket the user brought (see usecases.bucket_check)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Literal

from pydantic import Field

from spotguard.adapters.bucket import S3BucketSettings
from spotguard.adapters.clients import LazyClient
from spotguard.adapters.notify import TopicAlerts
from spotguard.runtime import utcnow
from spotguard.runtime.config import EnvModel
from spotguard.usecases.bucket_check import BucketCheck


class BucketCheckEnv(EnvModel):
    # "on" when the stack was given CheckpointBucketName; the bucket the stack creates is made right.
    check: Literal["on", "off"] = Field(default="off", alias="SPOTGUARD_BUCKET_CHECK")
    bucket: str = Field(default="", alias="SPOTGUARD_CHECKPOINT_BUCKET")
    topic_arn: str = Field(default="", alias="SPOTGUARD_TOPIC_ARN")


def bucket_check(
    environ: Mapping[str, str] | None = None, clock: Callable[[], datetime] = utcnow
) -> BucketCheck | None:
    """The check, or None when there is nothing to check (the stack's own bucket)."""
    env = BucketCheckEnv.load(environ)
    if env.check != "on" or not env.bucket:
        return None
    return BucketCheck(
        env.bucket, S3BucketSettings(LazyClient("s3")), TopicAlerts(LazyClient("sns"), env.topic_arn), clock
    )
