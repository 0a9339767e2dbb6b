"""Pools in the DynamoDB ledger (the same table as the jobs).

  pool#<cluster> / <pool name>   one pool (domain.pools.PoolRecord) as JSON in `doc`, with `rev` for
                                 compare-and-set; a pool discovery no longer finds is kept with
                                 `gone` = true and expires (TTL `expires_at`) GONE_RETENTION_DAYS later,
                                 unless discovery finds it again first (its facts are then still there)

Every write is a compare-and-set on `rev` (a new pool: on the item not existing). A write that loses the
race reads the pool again and applies the same change to what it finds, at most CAS_TRIES times: the
changes (domain.pools: merge_discovered, fold, with_spot_price, with_score) are pure and idempotent, so
applying one again to a newer pool is always right. A change that leaves the pool as it is writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from spotguard.adapters.dynamo import key, marshal, plain, written
from spotguard.domain import clock
from spotguard.domain.errors import one_line
from spotguard.domain.pools import (
    Observation,
    PoolRecord,
    ScoreQuote,
    SpotQuote,
    fold,
    mark_gone,
    merge_discovered,
    pool_key,
    with_score,
    with_spot_price,
)

log = logging.getLogger(__name__)

GONE_RETENTION_DAYS = 30
CAS_TRIES = 8


class PoolConflict(RuntimeError):
    """A pool changed under every one of CAS_TRIES writes (far beyond any real contention)."""


Change = Callable[[PoolRecord | None], PoolRecord | None]


class DynamoPoolStore:
    def __init__(self, client: Any, table: str) -> None:
        self.client = client
        self.table = table

    # ------------------------------------------------------------------------------------- reads
    def pools(self, cluster: str, include_gone: bool = False) -> list[PoolRecord]:
        """Every pool of a cluster, by name (one Query, following its pages)."""
        return [p for p, _rev in self._all(cluster, consistent=False) if include_gone or p.gone_since is None]

    def _all(self, cluster: str, consistent: bool) -> list[tuple[PoolRecord, int]]:
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :p",
            ExpressionAttributeValues=marshal({":p": pool_key(cluster)}),
            ConsistentRead=consistent,
        )
        found = []
        for item in (plain(i) for page in pages for i in page.get("Items", [])):
            record, rev = _record(item)
            if record is not None:
                found.append((record, rev))
        return sorted(found, key=lambda pr: pr[0].name)

    def _get(self, cluster: str, name: str) -> tuple[PoolRecord | None, int | None]:
        item = plain(
            self.client.get_item(
                TableName=self.table, Key=key(pool_key(cluster), name), ConsistentRead=True
            ).get("Item")
        )
        if not item:
            return None, None
        return _record(item)

    # ------------------------------------------------------------------------------------ writes
    def save_discovered(
        self, cluster: str, pools: Sequence[PoolRecord], now: datetime, complete: bool = True
    ) -> list[PoolRecord]:
        """Store what discovery found: a known pool keeps its facts (merge_discovered), a new one is
        added, and, when discovery was `complete`, a stored pool it did not find is marked gone (kept with
        its facts, expired later). The cluster's pools as stored now, gone ones left out."""
        stored = {p.name: (p, rev) for p, rev in self._all(cluster, consistent=True)}
        found = {p.name: p for p in pools if p.cluster == cluster}
        result: list[PoolRecord] = []
        for name, pool in found.items():

            def merge(current: PoolRecord | None, pool: PoolRecord = pool) -> PoolRecord:
                return merge_discovered(current, pool)

            result.append(self._apply(cluster, name, merge, stored.get(name)))
        if complete:
            for name, (old, rev) in stored.items():
                if name not in found and old.gone_since is None:
                    self._apply(
                        cluster, name, lambda current: current and mark_gone(current, now), (old, rev)
                    )
        return sorted((p for p in result if p.gone_since is None), key=lambda p: p.name)

    def record(self, cluster: str, pool_name: str, fact: Observation) -> PoolRecord | None:
        """Fold a fact into a pool (idempotent: the same fact again changes nothing). None: no such pool
        (not discovered yet, or expired); the fact is then not kept."""
        return self._apply(cluster, pool_name, lambda current: current and fold(current, fact), None)

    def set_prices(self, cluster: str, quotes: Sequence[SpotQuote]) -> int:
        """Apply newer spot prices to the pools they are for; how many pools changed."""
        return self._apply_to_all(cluster, lambda pool: _each(pool, quotes, with_spot_price))

    def set_scores(self, cluster: str, quotes: Sequence[ScoreQuote]) -> int:
        """Apply newer placement scores to the pools they are for; how many pools changed."""
        return self._apply_to_all(cluster, lambda pool: _each(pool, quotes, with_score))

    def _apply_to_all(self, cluster: str, change: Callable[[PoolRecord], PoolRecord]) -> int:
        changed = 0
        for pool, rev in self._all(cluster, consistent=True):
            after = self._apply(cluster, pool.name, lambda current: current and change(current), (pool, rev))
            changed += after is not None and after != pool
        return changed

    def _apply(
        self,
        cluster: str,
        name: str,
        change: Change,
        known: tuple[PoolRecord, int] | None,
    ) -> PoolRecord | None:
        """Compare-and-set `change` onto the pool: first onto `known` (what a Query just read, saving a
        read), then, after a lost race, onto what a consistent read finds."""
        current, rev = known if known is not None else self._get(cluster, name)
        for _ in range(CAS_TRIES):
            after = change(current)
            if after is None or after == current:
                return after
            if self._write(after, rev):
                return after
            current, rev = self._get(cluster, name)
        raise PoolConflict(f"pool {name} of cluster {cluster} changed under {CAS_TRIES} writes")

    def _write(self, pool: PoolRecord, rev: int | None) -> bool:
        pk, sk = pool.key
        item: dict[str, Any] = {
            "pk": pk,
            "sk": sk,
            "doc": pool.model_dump_json(),
            "rev": (rev or 0) + 1,
            "gone": pool.gone_since is not None,
            "updated_at": clock.now().isoformat(),
        }
        if pool.gone_since is not None:
            item["expires_at"] = int((pool.gone_since + timedelta(days=GONE_RETENTION_DAYS)).timestamp())
        if rev is None:
            return written(
                self.client.put_item,
                TableName=self.table,
                Item=marshal(item),
                ConditionExpression="attribute_not_exists(pk)",
            )
        return written(
            self.client.put_item,
            TableName=self.table,
            Item=marshal(item),
            ConditionExpression="rev = :r",
            ExpressionAttributeValues=marshal({":r": rev}),
        )


def _each(
    pool: PoolRecord, quotes: Sequence[Any], apply: Callable[[PoolRecord, Any], PoolRecord]
) -> PoolRecord:
    for quote in quotes:
        pool = apply(pool, quote)
    return pool


def _record(item: dict[str, Any]) -> tuple[PoolRecord | None, int]:
    """The pool an item holds and its rev; None for one that cannot be read (logged): the next discovery
    overwrites it, on its rev, as if it were new."""
    rev = int(item.get("rev", 0))
    try:
        return PoolRecord.model_validate_json(item["doc"]), rev
    except (ValidationError, KeyError) as exc:
        reason = one_line(exc) if isinstance(exc, ValidationError) else f"no {exc} attribute"
        log.warning("pool item %s / %s cannot be read: %s", item.get("pk"), item.get("sk"), reason)
        return None, rev
