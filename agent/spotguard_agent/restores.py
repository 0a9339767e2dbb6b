"""Restore straight into the training state (torch_state.restore): the Agent's `restore_state`.

The checkpoint is chosen as `Agent.restore` chooses it (SPOTGUARD_RESUME_FROM's or the newest committed,
passing over damaged ones and other jobs'), but nothing is downloaded into a directory: each rank reads
what it loads from the store. In a job of several ranks, rank 0 lists the checkpoints and reads each
manifest; every rank then reads its part of the same checkpoint in two steps (what may fail in one rank
alone, then what may be a collective), and after each the ranks agree on what happened before any of
them goes on, so that every rank makes the same collective calls:
- every rank did it: go on (restored, after the second);
- any rank found it damaged: every rank passes over it to the previous one;
- the state does not fit this job, or the checkpoint is in a format this agent does not read: every rank
  ends with RestoreFailed, exit 1 (a failure: no retry mends it);
- a read that failed for good: exit 69 in every rank (resubmitted: resuming later beats starting over);
- a read that may pass (throttling, 5xx, a timeout): every rank tries the same checkpoint again after a
  pause that doubles, `restore_attempts` times in all, then exit 69.
DCP's own collective load, when it fails in one rank, fails in every rank alike (CheckpointException).
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
    CheckpointUnavailable,
    StoreError,
    _short,
    is_damage,
    is_transient,
    unreadable,
)

if TYPE_CHECKING:
    from spotguard_agent.agent import AgentEnv
    from spotguard_agent.ranks import Collective

log = logging.getLogger("spotguard.agent")
T = TypeVar("T")

# What one rank's step of a restore came to. The ranks agree on the worst: damage first (the previous
# checkpoint may do), then what no retry mends (the state does not fit this job, a format this agent does
# not read: exit 1, a failure), then a read that failed (exit 69: resubmitted), then one that may pass.
RESTORED, DAMAGED, BROKEN, UNAVAILABLE, TRY_AGAIN = (
    "restored",
    "damaged",
    "broken",
    "unavailable",
    "try again",
)
WORST_FIRST = (DAMAGED, BROKEN, UNAVAILABLE, TRY_AGAIN, RESTORED)
BROKEN_EXIT = 1


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

    def restore_state(
        self, read: Callable[[Any], T], prepare: Callable[[Manifest], Any] | None = None
    ) -> tuple[Manifest, T] | None:
        """The chosen checkpoint's manifest and what this rank made of it; None for a fresh start. Two
        steps, each agreed by every rank before any goes on: `prepare(manifest)` (this rank alone, no
        collective: what may fail in one rank only, such as reading DCP's metadata), then
        `read(prepared)` (which may be a collective, as DCP's load into DTensor shards is). Raises
        RestoreFailed as Agent.restore does, and with exit 1 when the checkpoint cannot be loaded into
        this job at all (the state does not fit it, a format this agent does not read)."""
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
            outcome = self._read_agreed(prepare or (lambda m: m), read, manifest, agree)
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
        self,
        prepare: Callable[[Manifest], Any],
        read: Callable[[Any], T],
        manifest: Manifest,
        agree: Callable[[Any], list[Any]],
    ) -> tuple[T] | None:
        """(what `read` made,) once every rank read `manifest`; None when it is damaged somewhere."""
        from spotguard_agent.agent import CANNOT_RESTORE_NOW, RestoreFailed

        pause = self.store.retry_pause
        where = f"checkpoint {manifest.sequence} ({self.store.manifest_uri(manifest.sequence)})"
        for attempt in range(1, self.store.restore_attempts + 1):
            kind, why, prepared = _agreed(prepare, manifest, agree)
            if kind == RESTORED:
                kind, why, value = _agreed(read, prepared, agree)
                if kind == RESTORED:
                    return (value,)
            prepared = value = None  # let a state read in part go before the next try
            if kind == DAMAGED:
                self._pass_over(manifest.sequence, "damaged", why)
                return None
            if kind == BROKEN:
                line = f"{where} cannot be loaded into this job ({why})"
                code = BROKEN_EXIT
            elif kind == UNAVAILABLE or attempt == self.store.restore_attempts:
                line = unreadable(where, why, attempt)
                code = CANNOT_RESTORE_NOW
            else:
                log.warning("%s cannot be read now (%s); trying again in %.1f s", where, why, pause)
                time.sleep(pause)
                pause *= 2
                continue
            if self.ranks.leader:
                print(f"spotguard-agent: {line}", file=sys.stderr, flush=True)
            raise RestoreFailed(line, code)
        raise AssertionError("unreachable")


def _agreed(call: Callable[[Any], Any], arg: Any, agree: Callable[[Any], list[Any]]) -> tuple[str, str, Any]:
    """`call(arg)` in this rank, then what every rank's came to: the worst kind (damage first) with the
    first rank's reason for it, and this rank's value."""
    kind, why, value = _attempt(call, arg)
    outcomes = agree((kind, why))
    worst = min((k for k, _ in outcomes), key=WORST_FIRST.index)
    return worst, next(w for k, w in outcomes if k == worst), value


def _manifest_or_damage(store: Any, sequence: int, job_id: str) -> Manifest | str:
    """The manifest, or why it is passed over (another job's, damaged)."""
    try:
        return store.manifest_of(sequence, job_id)  # type: ignore[no-any-return]
    except Exception as exc:
        if not is_damage(exc):
            raise
        store.pass_over(sequence, "damaged", _short(exc))
        return ""


def _attempt(call: Callable[[Any], Any], arg: Any) -> tuple[str, str, Any]:
    """(what became of this rank's step, why in one line, its value)."""
    try:
        return RESTORED, "", call(arg)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        errors = _failures(exc)
        why = "; ".join(dict.fromkeys(_short(e) for e in errors))
        if any(is_damage(e) for e in errors):
            return DAMAGED, why, None
        if all(isinstance(e, _READ_ERRORS) and is_transient(e) for e in errors):
            return TRY_AGAIN, why, None
        if all(isinstance(e, (*_READ_ERRORS, CheckpointUnavailable)) for e in errors):
            return UNAVAILABLE, why, None
        return BROKEN, why, None


def _failures(exc: BaseException) -> list[BaseException]:
    """The errors behind `exc`: each rank's, for DCP's CheckpointException (every rank gets it alike)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        return [f[0] if isinstance(f, tuple) else f for _, f in sorted(failures.items())]
    return [exc]
