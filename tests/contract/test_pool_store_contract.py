"""The pool store's contract (DynamoPoolStore, adapters/pool_store.py), the same cases against its fake
(tests/fakes.py FakePoolStore) and against the adapter on moto: discovery merged into what is stored, pools no
longer found kept as gone, facts, prices and scores folded in (each safe to apply twice), a pool item that
cannot be read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spotguard.domain.pools import Observation, PoolRecord, ScoreQuote, SpotQuote
from tests.contract.conftest import Side

T0 = datetime(2026, 11, 21, 15, 0, tzinfo=UTC)
CLUSTER = "gpu-spot"


def pool(
    provider: str, market: str = "spot", zone: str = "us-east-1a", cluster: str = CLUSTER, **kw
) -> PoolRecord:
    base = {
        "cluster": cluster,
        "capacity_provider": provider,
        "auto_scaling_group": f"{provider}-group",
        "market": market,
        "instance_type": "g5.xlarge",
        "availability_zone": zone,
        "availability_zone_id": {"us-east-1a": "use1-az4", "us-east-1b": "use1-az6"}[zone],
        "gpus_per_instance": 1,
        "constrain_type": False,
        "constrain_zone": False,
        "discovered_at": T0,
    }
    return PoolRecord(**{**base, **kw})


A, B, OD = pool("gpu-spot-a"), pool("gpu-spot-b", zone="us-east-1b"), pool("gpu-od", "on-demand")
FAILURE = Observation(at=T0, available=False, source="launch-failure", detail="no g5.xlarge capacity")


def names(pools: list[PoolRecord]) -> list[str]:
    return [p.name for p in pools]


def test_a_cluster_with_nothing_stored_has_no_pools(side: Side):
    assert side.pools.pools(CLUSTER) == [] and side.pools.pools(CLUSTER, include_gone=True) == []


def test_discovery_stores_the_clusters_pools_by_name(side: Side):
    elsewhere = pool("other-spot", cluster="other")
    saved = side.pools.save_discovered(CLUSTER, [OD, B, A, elsewhere], T0)
    assert saved == [OD, A, B]  # by name; a pool of another cluster is not this cluster's
    assert side.pools.pools(CLUSTER) == [OD, A, B]
    assert side.pools.pools("other") == []


def test_a_fact_folds_into_its_pool_once(side: Side):
    side.pools.save_discovered(CLUSTER, [A, OD], T0)
    after = side.pools.record(CLUSTER, A.name, FAILURE)
    assert after is not None and after.observations == (FAILURE,)
    assert after.unavailable_until == T0 + timedelta(minutes=15)
    assert side.pools.record(CLUSTER, A.name, FAILURE) == after  # the same fact again
    assert side.pools.pools(CLUSTER) == [OD, after]


def test_a_fact_for_a_pool_not_stored_is_not_kept(side: Side):
    side.pools.save_discovered(CLUSTER, [A], T0)
    assert side.pools.record(CLUSTER, B.name, FAILURE) is None
    assert side.pools.record("other", A.name, FAILURE) is None
    assert side.pools.pools(CLUSTER) == [A] and side.pools.pools("other") == []


def test_discovery_again_keeps_a_pools_facts(side: Side):
    side.pools.save_discovered(CLUSTER, [A], T0)
    side.pools.record(CLUSTER, A.name, FAILURE)
    found = A.model_copy(update={"discovered_at": T0 + timedelta(hours=1), "on_demand_price": 1.006})
    (again,) = side.pools.save_discovered(CLUSTER, [found], T0 + timedelta(hours=1))
    assert again.observations == (FAILURE,) and again.discovered_at == T0  # first found at T0
    assert again.on_demand_price == 1.006  # what discovery says now
    assert side.pools.pools(CLUSTER) == [again]


def test_a_pool_a_complete_discovery_misses_is_kept_as_gone_and_comes_back_with_its_facts(side: Side):
    side.pools.save_discovered(CLUSTER, [A, B, OD], T0)
    side.pools.record(CLUSTER, B.name, FAILURE)
    later = T0 + timedelta(hours=1)
    assert side.pools.save_discovered(CLUSTER, [A], later, complete=False) == [A]  # nothing gone
    assert names(side.pools.pools(CLUSTER)) == [OD.name, A.name, B.name]
    assert side.pools.save_discovered(CLUSTER, [A, OD], later) == [OD, A]
    assert names(side.pools.pools(CLUSTER)) == [OD.name, A.name]
    gone = side.pools.pools(CLUSTER, include_gone=True)
    assert names(gone) == [OD.name, A.name, B.name] and gone[2].gone_since == later
    # a gone pool still takes facts (a late event about it)
    late = Observation(at=later, available=False, source="interruption", detail="i-1")
    assert side.pools.record(CLUSTER, B.name, late).gone_since == later
    again = later + timedelta(hours=1)
    found = [p.model_copy(update={"discovered_at": again}) for p in (A, B, OD)]
    back = {p.name: p for p in side.pools.save_discovered(CLUSTER, found, again)}
    assert back[B.name].gone_since is None and back[B.name].observations == (FAILURE, late)


def test_prices_and_scores_change_only_the_pools_they_are_for_and_only_once(side: Side):
    side.pools.save_discovered(CLUSTER, [A, B, OD], T0)
    price = SpotQuote(instance_type="g5.xlarge", availability_zone="us-east-1a", price=0.41, at=T0)
    assert side.pools.set_prices(CLUSTER, [price]) == 1  # A (OD is on-demand, B in another zone)
    assert side.pools.set_prices(CLUSTER, [price]) == 0
    older = price.model_copy(update={"price": 0.5, "at": T0 - timedelta(hours=1)})
    assert side.pools.set_prices(CLUSTER, [older]) == 0
    score = ScoreQuote(capacity_provider="gpu-spot-b", availability_zone_id="use1-az6", score=8, at=T0)
    assert side.pools.set_scores(CLUSTER, [score]) == 1
    assert side.pools.set_scores(CLUSTER, [score]) == 0
    assert side.pools.set_prices("other", [price]) == 0
    od, a, b = side.pools.pools(CLUSTER)
    assert (a.spot_price, a.spot_priced_at, a.placement_score) == (0.41, T0, None)
    assert (b.spot_price, b.placement_score, b.scored_at) == (None, 8, T0)
    assert od == OD


def test_a_pool_that_cannot_be_read_is_left_out_until_discovery_writes_it_again(side: Side):
    side.pools.save_discovered(CLUSTER, [A], T0)
    side.unreadable_pool(CLUSTER, B.name)
    assert side.pools.pools(CLUSTER, include_gone=True) == [A]
    assert side.pools.record(CLUSTER, B.name, FAILURE) is None
    assert side.pools.save_discovered(CLUSTER, [A, B], T0 + timedelta(hours=1)) == [A, B]
    assert side.pools.pools(CLUSTER) == [A, B]
