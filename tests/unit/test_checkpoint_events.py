"""Which S3 events are committed checkpoints, and the manifest contract between agent and manager."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError
from spotguard_agent.manifest import FileEntry, Manifest

from spotguard.domain.checkpoints import classify_object_created, manifest_location, parse_manifest

from ..conftest import load_event


def event_for(key: str, **detail):
    e = load_event("s3-manifest-created.json")
    e["detail"]["object"]["key"] = key
    e["detail"].update(detail)
    return json.dumps(e)


def test_a_manifest_is_a_committed_checkpoint():
    e = classify_object_created(json.dumps(load_event("s3-manifest-created.json")))
    assert e.outcome == "act"
    assert e.prefix_uri == "s3://spotguard-checkpointbucket-1a2b3c4d5e6f/jobs/j-7f3a9c/"
    assert e.sequence == 12


@pytest.mark.parametrize(
    ("key", "prefix", "seq"),
    [
        ("checkpoints/0000000000/MANIFEST.json", "s3://b/", 0),
        ("a/b/c/checkpoints/0000000007/MANIFEST.json", "s3://b/a/b/c/", 7),
    ],
)
def test_manifest_locations(key, prefix, seq):
    assert manifest_location("b", key) == (prefix, seq)


@pytest.mark.parametrize(
    "key",
    [
        "jobs/j/checkpoints/0000000012/model.pt",
        "jobs/j/checkpoints/MANIFEST.json",
        "jobs/j/checkpoints/12a/MANIFEST.json",
        "jobs/j/MANIFEST.json",
        "jobs/j/checkpoints/0000000012/sub/MANIFEST.json",
    ],
)
def test_other_objects_are_ignored(key):
    assert classify_object_created(event_for(key)).outcome == "ignore"


@pytest.mark.parametrize("body", ["{not json", json.dumps({"source": "aws.s3"}), json.dumps([1])])
def test_bad_events_are_rejected_in_one_line(body):
    e = classify_object_created(body)
    assert e.outcome == "reject" and "\n" not in e.reason


def test_the_agents_manifest_is_what_the_manager_reads():
    written = Manifest(
        sequence=3,
        job_id="j-1",
        attempt=2,
        step=1200,
        progress=0.4,
        created_at=datetime(2026, 11, 21, 14, 47, tzinfo=UTC),
        files=(FileEntry(path="model/state.pt", size=10, sha256="a" * 64),),
    ).model_dump_json()
    read = parse_manifest(written)
    assert (read.sequence, read.job_id, read.attempt, read.step, read.progress) == (3, "j-1", 2, 1200, 0.4)
    assert read.files[0].path == "model/state.pt" and read.total_bytes == 10


@pytest.mark.parametrize(
    "change",
    [
        {"progress": 1.5},
        {"files": []},
        {"files": [{"path": "../x", "size": 1, "sha256": "a" * 64}]},
        {"files": [{"path": "x", "size": 1, "sha256": "nothex"}]},
        {"step": -1},
    ],
)
def test_both_sides_refuse_the_same_bad_manifests(change):
    good = {
        "sequence": 1,
        "step": 1,
        "progress": 0.1,
        "created_at": "2026-11-21T00:00:00Z",
        "files": [{"path": "w", "size": 1, "sha256": "a" * 64}],
    }
    bad = json.dumps({**good, **change})
    with pytest.raises(ValidationError):
        parse_manifest(bad)
    if change != {"files": []}:  # an empty commit is refused by the agent before any manifest is made
        with pytest.raises(ValidationError):
            Manifest.model_validate_json(bad)


def test_the_checkpoints_classifier_refuses_what_every_classifier_refuses():
    """The same envelope as the other queues' classifiers (domain/envelope.py): a console sample's
    placeholder, an absurd nesting, a time given as a number are refused in one line."""
    raw = event_for("jobs/j/checkpoints/0000000012/MANIFEST.json")
    raw = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    placeholder = {**raw, "detail": {**raw["detail"], "bucket": {"name": "<bucket-name>"}}}
    numeric_time = {**raw, "time": 1764000000}
    for bad, why in ((placeholder, "placeholder"), (numeric_time, "time")):
        e = classify_object_created(json.dumps(bad))
        assert e.outcome == "reject" and why in e.reason and "\n" not in e.reason, e
