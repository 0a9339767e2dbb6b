"""The checkpoint manifest: written last, it is what makes a checkpoint committed.

Layout (docs/container-contract.md): `<checkpoint uri>checkpoints/<sequence, zero-padded>/<files>` with
MANIFEST.json listing every file with its size and sha256, the step, the progress (0..1), the attempt
and the time. No manifest = not a checkpoint.

This module is the one definition of the manifest, for both sides: the agent writes (and restores) with
it, and SpotGuard's checkpoints function reads with it. The core layer ships this very file as
`spotguard.domain.manifest`: layers/core/spotguard/domain/manifest.py is a symbolic link to it, which
`sam build` copies into the layer as a plain file. Why a link, and not the core depending on this
package: the agent is installed from agent/ alone (examples/Dockerfile), so the file must live here; the
layer is built from layers/core alone (its ContentUri) with layers/core/requirements.txt, which cannot
name a package that is not on an index without a path that depends on where `sam build` runs; and the
whole package would put the agent's S3 transfer code with boto3 and s3transfer into the layer, while
importing `spotguard_agent.manifest` runs the package's __init__, which loads all of it, on the
interruption function's cold start. With the link both packages stay independently installable and the
layer gains one small module. So: nothing here may import more than the standard library and pydantic,
nor any other module of the agent.

Reading is tolerant of fields it does not know (a newer agent may add some); a manifest lists at least
one file (the agent never commits an empty directory) and no path twice.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MANIFEST = "MANIFEST.json"
SEQUENCE_DIGITS = 10
FORMAT_VERSION = 1
_CHUNK = 8 * 1024 * 1024


class FileEntry(BaseModel):
    model_config = ConfigDict(frozen=True)
    path: str = Field(min_length=1, description="relative to the checkpoint directory, '/' separated")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    # the checkpoint's file that lists this file's blocks, each with its sha256 (torch_state's files:
    # spotguard_agent.dcp_files), for restores that read part of it; None: read and verify it whole
    blocks: str | None = None

    @field_validator("path", "blocks")
    @classmethod
    def _relative_and_inside(cls, v: str | None) -> str | None:
        if v is None:
            return v
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or "\\" in v or v == MANIFEST:
            raise ValueError(f"{v!r} is not a plain relative path inside the checkpoint")
        return v


class Manifest(BaseModel):
    """What MANIFEST.json holds (fields a newer agent may add are ignored when read)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    format: int = FORMAT_VERSION
    sequence: int = Field(ge=0)
    job_id: str = ""
    attempt: int = Field(default=0, ge=0)
    step: int = Field(ge=0)
    # what `step` counts: the job's training steps (the agent's library), or the commits of the wrapper
    # (`spotguard-agent run --dir`), which knows nothing of the job's steps
    counts: Literal["steps", "commits"] = "steps"
    progress: float = Field(ge=0.0, le=1.0)
    created_at: datetime
    files: tuple[FileEntry, ...] = Field(min_length=1)

    @field_validator("files")
    @classmethod
    def _unique(cls, v: tuple[FileEntry, ...]) -> tuple[FileEntry, ...]:
        paths = [f.path for f in v]
        if len(set(paths)) != len(paths):
            raise ValueError("a file is listed twice")
        listed = set(paths)
        if any(f.blocks is not None and (f.blocks not in listed or f.blocks == f.path) for f in v):
            raise ValueError("a file's blocks are in a file the manifest does not list")
        return v

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def sequence_name(sequence: int) -> str:
    return f"{sequence:0{SEQUENCE_DIGITS}d}"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def list_files(directory: Path) -> list[str]:
    """Every regular file under `directory` (symlinks are not followed), relative, '/' separated."""
    out = []
    for p in sorted(directory.rglob("*")):
        if p.is_file() and not p.is_symlink():
            rel = p.relative_to(directory).as_posix()
            if rel != MANIFEST:
                out.append(rel)
    return out
