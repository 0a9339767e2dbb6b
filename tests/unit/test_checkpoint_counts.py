"""What a checkpoint's step counts (issue 45, item 15): the agent's library counts training steps, its
wrapper counts its own commits; every place that says a checkpoint's step says which."""

from __future__ import annotations

from datetime import UTC, datetime

from spotguard.domain.manifest import FileEntry, Manifest
from spotguard.usecases.checkpoints import _ref
from spotguard_cli.answers import CheckpointView
from spotguard_cli.jobs.log_lines import resumed_from

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _manifest(**kw) -> Manifest:
    files = (FileEntry(path="state.txt", size=2, sha256="0" * 64),)
    return Manifest(sequence=1, step=2, progress=0.0, created_at=T0, files=files, **kw)


def test_a_wrappers_checkpoint_says_wrapper_commit_and_a_librarys_says_step():
    uri = "s3://b/p/checkpoints/00000001/MANIFEST.json"
    wrapper = _ref("s3://b/p/", "b", "p/checkpoints/00000001/MANIFEST.json", _manifest(counts="commits"))
    library = _ref("s3://b/p/", "b", "p/checkpoints/00000001/MANIFEST.json", _manifest())
    assert (wrapper.step_label, library.step_label) == ("wrapper commit 2", "step 2")
    old = Manifest.model_validate_json(_manifest().model_dump_json(exclude={"counts"}))
    assert old.counts == "steps"  # a manifest of an older agent
    for ref, said in ((wrapper, "wrapper commit 2"), (library, "step 2")):
        view = CheckpointView.model_validate(ref.model_dump(mode="json"))
        attempt = type("A", (), {"resume_from": uri, "snapshot_id": None})()
        assert resumed_from(attempt, None, [view]) == f"from checkpoint #1 ({said}, 0%)"  # type: ignore[arg-type]
