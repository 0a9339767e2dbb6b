"""EBS mode over moto: each attempt gets a managed EBS volume; when an attempt is interrupted its volume
is snapshotted (tagged with the job and attempt), the next attempt starts from the snapshot once it has
completed, and the old volume and snapshots beyond retention are deleted."""

from __future__ import annotations

import pytest

from spotguard_cli.emulator.gpucluster import gpu_container
from spotguard_cli.emulator.inject import snapshot_event
from spotguard_cli.emulator.world import JobsWorld

pytestmark = pytest.mark.slow  # every test deploys the stack into moto

MOUNT = "/var/spotguard/checkpoints"


def _ebs_definition(jobs: JobsWorld, gpus: int = 1, at_launch: bool = True) -> str:
    ecs = jobs.stack.client("ecs")
    resp = ecs.register_task_definition(
        family=f"train-ebs-{gpus}gpu",
        containerDefinitions=[
            gpu_container(gpus, mountPoints=[{"sourceVolume": "ckpt", "containerPath": MOUNT}])
        ],
        volumes=[{"name": "ckpt", "configuredAtLaunch": at_launch}],
    )
    return str(resp["taskDefinition"]["taskDefinitionArn"])


def _submit(jobs: JobsWorld, gpus: int = 1, **ebs) -> dict:
    answer = jobs.invoke(
        {
            "action": "submit",
            "job_id": "ebs-job",
            "request": {
                "cluster": "gpu-spot",
                "taskDefinition": _ebs_definition(jobs, gpus),
                "launchType": "EC2",
            },
            "options": {"checkpoint_mode": "ebs", "ebs": {"size_gib": 200, **ebs}},
        }
    )
    assert answer["ok"], answer
    return answer["job"]


def _volume(request: dict) -> dict:
    (conf,) = request["volumeConfigurations"]
    assert conf["name"] == "ckpt"
    return conf["managedEBSVolume"]


def _interrupt(jobs: JobsWorld, arn: str) -> None:
    jobs.emit(arn)
    jobs.stop(arn, "SpotGuard: spot-interruption e on i-0123456789abcdef0")
    jobs.emit(arn, exit_code=75)


def _snapshots(jobs: JobsWorld) -> list[dict]:
    ec2 = jobs.stack.client("ec2")
    return ec2.describe_snapshots(
        OwnerIds=["self"], Filters=[{"Name": "tag:spotguard:job-id", "Values": ["ebs-job"]}]
    )["Snapshots"]


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_an_interrupted_ebs_job_resumes_from_the_snapshot_of_its_volume(jobs: JobsWorld, gpus):
    job = _submit(jobs, gpus)
    (first,) = jobs.scheduler.requests
    volume = _volume(first)
    assert volume["sizeInGiB"] == 200 and volume["terminationPolicy"] == {"deleteOnTermination": False}
    assert volume["roleArn"] == jobs.stack.functions["JobsFunction"].environment["SPOTGUARD_EBS_ROLE_ARN"]
    assert "snapshotId" not in volume and volume["encrypted"] is True
    tags = {t["key"]: t["value"] for t in volume["tagSpecifications"][0]["tags"]}
    assert tags == {"spotguard:job-id": "ebs-job", "spotguard:attempt": "1"}
    env = {e["name"]: e["value"] for e in first["overrides"]["containerOverrides"][0]["environment"]}
    assert env["SPOTGUARD_CHECKPOINT_URI"] == f"file://{MOUNT}/" and env["SPOTGUARD_RESUME_FROM"] == ""

    _interrupt(jobs, job["task_arn"])
    (snap,) = _snapshots(jobs)
    tags = {t["Key"]: t["Value"] for t in snap["Tags"]}
    assert tags == {"spotguard:job-id": "ebs-job", "spotguard:attempt": "1"}
    assert snap["VolumeId"] == jobs.scheduler.volumes[0]
    # moto completes a snapshot at once: the job goes on without waiting for the notification
    second = jobs.scheduler.requests[1]
    assert _volume(second)["snapshotId"] == snap["SnapshotId"]
    assert {t["value"] for t in _volume(second)["tagSpecifications"][0]["tags"]} == {"ebs-job", "2"}
    status = jobs.status("ebs-job")
    assert status["state"] == "running" and status["attempts"][0]["snapshot_id"] == snap["SnapshotId"]
    assert status["snapshots"] == [snap["SnapshotId"]]
    volumes = jobs.stack.client("ec2").describe_volumes()["Volumes"]
    assert jobs.scheduler.volumes[0] not in {v["VolumeId"] for v in volumes}  # the old volume is deleted
    # the notification arriving afterwards (at least once) changes nothing
    jobs.put(snapshot_event(snap["SnapshotId"], snap["VolumeId"]))
    jobs.task_events.drain()
    assert len(jobs.scheduler.requests) == 2


def test_a_pending_snapshot_waits_for_its_notification(jobs: JobsWorld, monkeypatch):
    from spotguard.adapters.ebs import EbsAdapter

    monkeypatch.setattr(EbsAdapter, "snapshot_state", lambda self, snapshot_id: "pending")  # as in AWS
    job = _submit(jobs)
    _interrupt(jobs, job["task_arn"])
    assert jobs.status("ebs-job")["state"] == "snapshotting" and len(jobs.scheduler.requests) == 1
    (snap,) = _snapshots(jobs)
    jobs.put(snapshot_event(snap["SnapshotId"], snap["VolumeId"], ok=True))
    jobs.task_events.drain()
    assert jobs.status("ebs-job")["state"] == "running"
    assert _volume(jobs.scheduler.requests[1])["snapshotId"] == snap["SnapshotId"]


def test_a_failed_snapshot_falls_back_to_the_one_before(jobs: JobsWorld, monkeypatch):
    from spotguard.adapters.ebs import EbsAdapter

    job = _submit(jobs)
    _interrupt(jobs, job["task_arn"])  # the first snapshot completes
    good = jobs.status("ebs-job")["attempts"][0]["snapshot_id"]
    monkeypatch.setattr(EbsAdapter, "snapshot_state", lambda self, snapshot_id: "pending")
    _interrupt(jobs, jobs.status("ebs-job")["task_arn"])
    bad = jobs.status("ebs-job")["attempts"][1]["snapshot_id"]
    jobs.put(snapshot_event(bad, "vol-0123456789abcdef0", ok=False))
    jobs.task_events.drain()
    assert jobs.status("ebs-job")["state"] == "running"
    assert _volume(jobs.scheduler.requests[2])["snapshotId"] == good
    waiting = [e["detail"]["message"] for e in jobs.job_events() if e["detail"]["kind"] == "waiting"]
    assert any(f"resuming from {good}" in m and "failed" in m for m in waiting), waiting


def test_snapshots_beyond_retention_are_deleted(jobs: JobsWorld):
    job = _submit(jobs, keep_snapshots=1)
    for _ in range(2):
        _interrupt(jobs, jobs.status(job["job_id"])["task_arn"])
    snaps = _snapshots(jobs)
    assert len(snaps) == 1 and {t["Value"] for t in snaps[0]["Tags"]} == {"ebs-job", "2"}
    assert _volume(jobs.scheduler.requests[2])["snapshotId"] == snaps[0]["SnapshotId"]


def test_reconcile_settles_a_snapshot_whose_notification_was_lost(jobs: JobsWorld, monkeypatch):
    from spotguard.adapters.ebs import EbsAdapter

    monkeypatch.setattr(EbsAdapter, "snapshot_state", lambda self, snapshot_id: "pending")
    job = _submit(jobs)
    _interrupt(jobs, job["task_arn"])
    monkeypatch.undo()  # the snapshot completes; its notification never comes
    jobs.shift_clock(600)
    assert jobs.reconcile()["snapshots_settled"] == 1
    assert jobs.status("ebs-job")["state"] == "running" and len(jobs.scheduler.requests) == 2


@pytest.mark.parametrize(
    ("options", "at_launch", "message"),
    [
        ({"checkpoint_mode": "ebs"}, False, "needs a volume configuredAtLaunch"),
        ({"checkpoint_mode": "ebs", "ebs": {"volume_type": "magnetic"}}, True, "options.ebs.volume_type"),
        ({"checkpoint_mode": "ebs", "ebs": {"role_arn": "not-a-role"}}, True, "options.ebs.role_arn"),
    ],
)
def test_bad_ebs_submissions_are_refused(jobs: JobsWorld, options, at_launch, message):
    td = _ebs_definition(jobs, at_launch=at_launch)
    answer = jobs.invoke(
        {"action": "submit", "request": {"cluster": "gpu-spot", "taskDefinition": td}, "options": options}
    )
    assert not answer["ok"] and message in answer["error"]["message"], answer
    assert jobs.scheduler.requests == []


def test_a_volume_configured_at_launch_means_ebs_mode_unless_told_otherwise(jobs: JobsWorld):
    td = _ebs_definition(jobs)
    answer = jobs.invoke({"action": "submit", "request": {"cluster": "gpu-spot", "taskDefinition": td}})
    assert answer["ok"] and answer["job"]["checkpoint_uri"] == f"file://{MOUNT}/"
    assert _volume(jobs.scheduler.requests[0])["sizeInGiB"] == 100
    answer = jobs.invoke(
        {
            "action": "submit",
            "request": {"cluster": "gpu-spot", "taskDefinition": td},
            "options": {"checkpoint_mode": "s3"},
        }
    )
    assert answer["ok"] and answer["job"]["checkpoint_uri"].startswith("s3://")
