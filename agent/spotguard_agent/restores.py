"""Restore straight into the training state (torch_state.restore): the Agent's `restore_state`.

The checkpoint is chosen as `Agent.restore` chooses it (SPOTGUARD_RESUME_FROM's or the newest committed,
passing over damaged ones and other jobs'), but nothing is downloaded into a directory: `read(manifest)`
reads what this rank loads from the store. In a job of several ranks, rank 0 lists the checkpoints and
reads each manifest; every rank then reads its part of the same checkpoint, and the ranks agree on what
happened before any of them goes on:
- every rank read it: restored;
- any rank found it damaged: every rank passes over it to the previous one;
- a read that may pass (throttling, 5xx, a timeout): every rank tries the same checkpoint again after a
  pause that doubles, `restore_attempts` times in all;
- anything else: every rank ends with the same RestoreFailed (exit 69, or 2 when refused).
DCP's own collective load, when it fails in one rank, fails in every rank alike (CheckpointException), so
the agreement also holds for loads into DTensor shards.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from spotguard_agent.manifest import Manifest
from spotguard_agent.ranks import Ranks
from spotguard_agent.store import CheckpointStore
from spotguard_agent.store_errors import (
    _READ_ERRORS,
    StoreError,
    _short,
    is_damage,
    is_transient,
)

if TYPE_CHECKING:
    from spotguard_agent.agent import AgentEnv
    from spotguard_agent.ranks import Collective

log = logging.getLogger("spotguard.agent")
T = TypeVar("T")

# what one rank's read of a checkpoint came to, and the word the ranks agree with
RESTORED, DAMAGED, TRY_AGAIN, FAILED = "restored", "damaged", "try again", "failed"


class Restores:
    """The mixin of Agent that restores straight into the state (see the module's doc)."""

    env: AgentEnv
    store: CheckpointStore
    ranks: Ranks
    restored: Manifest | None
    restore_seconds: float | None
    _last_commit: float

    if TYPE_CHECKING:

        def _coll(self) -> Collective: ...

        def _refused(self, exc: StoreError) -> tuple[str, int]: ...

    def restore_state(self, read: Callable[[Manifest], T]) -> tuple[Manifest, T] | None:
        """The chosen checkpoint's manifest and what `read(manifest)` made of it in this rank; None for a
        fresh start. Raises RestoreFailed as Agent.restore does."""
        from spotguard_agent.agent import RestoreFailed

        began = time.monotonic()
        coll = self._coll() if self.ranks.distributed else None
        agree = (lambda x: coll.gather(x, commit=False)) if coll is not None else (lambda x: [x])
        share = (lambda x: coll.broadcast(x, commit=False)) if coll is not None else (lambda x: x)
        job_id = self.env.job_id if "job_id" in self.env.model_fields_set else ""
        listed = share(self._leader_only(lambda: self.store.candidates(self.env.resume_from or None)))
        if isinstance(listed, tuple):
            raise RestoreFailed(*listed)
        for sequence in reversed(listed):
            manifest = share(self._leader_only(lambda s=sequence: _manifest_or_damage(self.store, s, job_id)))
            if isinstance(manifest, tuple):
                raise RestoreFailed(*manifest)
            if manifest == "":  # damaged: passed over already
                continue
            if isinstance(manifest, str):
                self._pass_over(sequence, manifest)
                continue
            outcome = self._read_agreed(read, manifest, agree)
            if outcome is None:
                continue
            self.store.restored = sequence
            self.restored = manifest
            self._last_commit = time.monotonic()
            self.restore_seconds = self._last_commit - began
            if self.ranks.leader:
                log.info("restored checkpoint %s (step %s) into the state", manifest.sequence, manifest.step)
            return manifest, outcome[0]
        self.restored = None
        return None

    def _pass_over(self, sequence: int, why: str, detail: str = "") -> None:
        if self.ranks.leader:  # the one that keeps the retention's count, and says it once
            self.store.pass_over(sequence, why, detail)

    def _leader_only(self, call: Callable[[], Any]) -> Any:
        """`call()` in rank 0 (None elsewhere); a StoreError becomes (why, exit code), said once."""
        if not self.ranks.leader:
            return None
        try:
            return call()
        except StoreError as exc:
            return self._refused(exc)

    def _read_agreed(
        self, read: Callable[[Manifest], T], manifest: Manifest, agree: Callable[[Any], list[Any]]
    ) -> tuple[T] | None:
        """(what `read` made,) once every rank read `manifest`; None when it is damaged somewhere."""
        from spotguard_agent.agent import CANNOT_RESTORE_NOW, RestoreFailed

        pause = self.store.retry_pause
        for attempt in range(1, self.store.restore_attempts + 1):
            kind, why, value = _attempt(read, manifest)
            outcomes = agree((kind, why))
            kinds = {k for k, _ in outcomes}
            if kinds == {RESTORED}:
                return (value,)  # type: ignore[return-value]
            first = next((w for k, w in outcomes if k in (FAILED, DAMAGED, TRY_AGAIN) and w), why)
            if DAMAGED in kinds:
                self._pass_over(manifest.sequence, "damaged", next(w for k, w in outcomes if k == DAMAGED))
                return None
            if FAILED in kinds or attempt == self.store.restore_attempts:
                tries = f"{attempt} tr{'y' if attempt == 1 else 'ies'}"
                line = (
                    f"checkpoint {manifest.sequence} ({self.store.manifest_uri(manifest.sequence)}) cannot "
                    f"be read now ({first}; {tries}): restore later rather than start from scratch"
                )
                if self.ranks.leader:
                    print(f"spotguard-agent: {line}", file=sys.stderr, flush=True)
                raise RestoreFailed(line, CANNOT_RESTORE_NOW)
            log.warning(
                "checkpoint %s cannot be read now (%s); trying again in %.1f s",
                manifest.sequence,
                first,
                pause,
            )
            time.sleep(pause)
            pause *= 2
        raise AssertionError("unreachable")


def _manifest_or_damage(store: Any, sequence: int, job_id: str) -> Manifest | str:
    """The manifest, or why it is passed over (another job's, damaged)."""
    try:
        return store.manifest_of(sequence, job_id)  # type: ignore[no-any-return]
    except Exception as exc:
        if not is_damage(exc):
            raise
        store.pass_over(sequence, "damaged", _short(exc))
        return ""


def _attempt(read: Callable[[Manifest], T], manifest: Manifest) -> tuple[str, str, T | None]:
    """(what became of this rank's read, why in one line, its value)."""
    try:
        return RESTORED, "", read(manifest)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        errors = _failures(exc)
        why = "; ".join(dict.fromkeys(_short(e) for e in errors))
        if any(is_damage(e) for e in errors):
            return DAMAGED, why, None
        if all(isinstance(e, _READ_ERRORS) and is_transient(e) for e in errors):
            return TRY_AGAIN, why, None
        return FAILED, why, None


def _failures(exc: BaseException) -> list[BaseException]:
    """The errors behind `exc`: each rank's, for DCP's CheckpointException (every rank gets it alike)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        return [f[0] if isinstance(f, tuple) else f for _, f in sorted(failures.items())]
    return [exc]
