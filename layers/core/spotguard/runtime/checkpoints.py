"""The checkpoints function's runtime: committed manifests into the ledger."""

from __future__ import annotations

from spotguard.adapters.clients import LazyClient, client
from spotguard.adapters.ledger import DynamoLedger
from spotguard.adapters.queues import DeadLetters
from spotguard.adapters.s3 import S3Checkpoints
from spotguard.runtime.config import CheckpointsEnv
from spotguard.usecases.checkpoints import CheckpointService


class CheckpointsRuntime:
    def __init__(self, env: CheckpointsEnv) -> None:
        self.env = env
        self.ledger = DynamoLedger(client("dynamodb"), env.ledger_table)
        self.service = CheckpointService(S3Checkpoints(client("s3")), self.ledger)
        self.dead_letters = DeadLetters(LazyClient("sqs"), env.dead_letter_url)
