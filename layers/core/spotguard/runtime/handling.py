"""One classified SQS record routed the same way by the three queue handlers (interruptions, task events,
checkpoints).

A handler parses a record into a classified message (notices.Decision, task_events.TaskMessage,
checkpoints.ManifestEvent), whose `outcome` says what to do with it and `reason` why:
- reject: bad input that no retry can fix: a warning, and the body goes to the dead-letter queue with
  the reason; the batch goes on;
- ignore: one log line (the handler adds its own fields, and may keep it at debug level), nothing else;
- anything else (act, and the task-events queue's launch and snapshot): the handler's use case runs; an
  exception there fails only this record, so SQS delivers it again.
Every log line of the record carries its event's id (or, without one, the SQS message id) as the
correlation id.

The interruption function imports this on its cold start: nothing here is imported but the standard
library (Powertools' Logger is only named in annotations).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from aws_lambda_powertools import Logger

    from spotguard.ports import DeadLetters


class Record(Protocol):
    """What routing reads of an SQS record (Powertools' SQSRecord)."""

    @property
    def body(self) -> str: ...

    @property
    def message_id(self) -> str: ...


class Classified(Protocol):
    @property
    def outcome(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def event_id(self) -> str | None: ...


C = TypeVar("C", bound=Classified)


class Router:
    def __init__(self, logger: Logger, dead_letters: DeadLetters, quiet_ignores: bool = False) -> None:
        self.logger = logger
        self.dead_letters = dead_letters
        self.quiet_ignores = quiet_ignores  # log ignored records at debug level (most are expected noise)

    def route(
        self,
        record: Record,
        message: C,
        act: Callable[[C], None],
        ignored: Mapping[str, object] | None = None,
    ) -> None:
        """Reject, ignore or act on `message`, the classified `record`; `ignored`: the handler's fields
        for the line that says the record was ignored."""
        self.logger.set_correlation_id(message.event_id or record.message_id)
        if message.outcome == "reject":
            self._dead_letter(record, message.reason, "rejected")
        elif message.outcome == "ignore":
            log = self.logger.debug if self.quiet_ignores else self.logger.info
            # stacklevel 3: the line's location is the handler's function that routed the record
            log("ignored", extra={"reason": message.reason, **(ignored or {})}, stacklevel=3)
        else:
            act(message)

    def reject(self, record: Record, reason: str, what: str = "rejected") -> None:
        """Send `record` to the dead-letter queue with `reason` (found while acting): retrying cannot
        fix it. `what`: the warning's message."""
        self._dead_letter(record, reason, what)

    def _dead_letter(self, record: Record, reason: str, what: str) -> None:
        # stacklevel 4: the location is the handler's function (it called route or reject, which called this)
        self.logger.warning(what, extra={"reason": reason, "message_id": record.message_id}, stacklevel=4)
        self.dead_letters.send(record.body, reason, record.message_id)
