"""A sweep's discovery failing, whole or in part (issue 29): every failure is logged with its reason and
counted in reconcile's outcome (`discovery_errors`, the metric ReconcileDiscoveryErrors), and one failed
call loses only what it must: a spot price request that fails for one type loses that type's price (its
pools keep the one they had), not the cluster's discovery. PoolService, PlacementAdvisor and Reconciler on
fakes of the finder and the ledger."""

from __future__ import annotations

import logging
from datetime import timedelta

from spotguard.domain.pools import PoolRecord, SpotQuote, discover_pools, pool_options
from spotguard.usecases.jobs.advisor import PlacementAdvisor
from spotguard.usecases.jobs.reconcile import Reconciler
from spotguard.usecases.jobs.service import JobService
from spotguard.usecases.pools import PoolService
from tests.fakes import FakeJobEcs, FakeJobStore, FakePoolStore
from tests.unit.test_job_engine import _engine
from tests.unit.test_pools import NOW, described

REFUSED = "InvalidParameterValue: The following supplied instance types do not exist: [g6.xlarge]"


class Finder:
    """The cluster of tests/unit/test_pools.py; spot prices refused for any request naming `refuse`."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.asked: list[list[str]] = []

    def discover(self, cluster, now=None):
        return discover_pools(described(), now)

    def spot_prices(self, instance_types, zones, now=None):
        self.asked.append(sorted(instance_types))
        if self.refuse in instance_types:
            raise RuntimeError(REFUSED)
        return [
            SpotQuote(instance_type=t, availability_zone=z, price=0.25, at=now)
            for t in instance_types
            for z in zones
        ]

    def placement_scores(self, instance_types, region):
        return {}


def _spot(ledger: FakePoolStore, itype: str) -> list[PoolRecord]:
    return [p for p in ledger.by_name.values() if p.market == "spot" and p.instance_type == itype]


def test_a_price_request_refused_for_one_type_loses_only_that_types_price(caplog):
    ledger = FakePoolStore()
    PoolService(Finder(), ledger, "us-east-1").refresh("gpu-spot", NOW)
    assert all(p.spot_price == 0.25 and p.spot_priced_at == NOW for p in _spot(ledger, "g6.xlarge"))

    finder = Finder(refuse="g6.xlarge")
    later = NOW + timedelta(hours=1)  # the prices are due again
    with caplog.at_level(logging.WARNING):
        refreshed = PoolService(finder, ledger, "us-east-1").refresh("gpu-spot", later)
    assert len(refreshed.pools) == len(ledger.by_name)  # discovery is kept, every pool saved
    (error,) = refreshed.errors
    assert error == f"cluster gpu-spot: spot prices of g6.xlarge could not be read: RuntimeError: {REFUSED}"
    assert error in caplog.text
    assert finder.asked[0] == ["g4dn.xlarge", "g5.xlarge", "g6.xlarge"]  # one request, then one per type
    assert sorted(map(tuple, finder.asked[1:])) == [("g4dn.xlarge",), ("g5.xlarge",), ("g6.xlarge",)]
    assert all(p.spot_priced_at == later for p in _spot(ledger, "g5.xlarge"))
    # the refused type keeps the price it had, read at its time: asked again at the next sweep
    assert all(p.spot_price == 0.25 and p.spot_priced_at == NOW for p in _spot(ledger, "g6.xlarge"))


def test_a_new_pool_whose_price_cannot_be_read_has_no_price_and_is_not_available():
    ledger = FakePoolStore()
    refreshed = PoolService(Finder(refuse="g6.xlarge"), ledger, "us-east-1").refresh("gpu-spot", NOW)
    assert len(refreshed.errors) == 1
    assert all(p.spot_price is None and p.spot_priced_at is None for p in _spot(ledger, "g6.xlarge"))
    options = pool_options(PoolService(Finder(), ledger, "us-east-1").pools("gpu-spot"), NOW, 1 / 6)
    assert {o.name: o.available for o in options if "g6.xlarge" in o.name} == {
        "gpu-spot-gpu1-spot/g6.xlarge/us-east-1a": False,
        "gpu-spot-gpu1-spot/g6.xlarge/us-east-1b": False,
    }


class Book:
    """PoolService for two clusters, one of which cannot be discovered."""

    def __init__(self) -> None:
        self.service = PoolService(Finder(refuse="g6.xlarge"), FakePoolStore(), "us-east-1")

    def refresh(self, cluster, now):
        if cluster == "broken":
            raise RuntimeError("AccessDeniedException: ecs:DescribeClusters\nsecond line")
        return self.service.refresh(cluster, now)


def test_a_cluster_whose_discovery_fails_is_logged_and_counted_and_stops_no_other(caplog):
    advisor = PlacementAdvisor(Book(), FakeJobStore(), lambda: NOW, clusters=("broken", "gpu-spot"))
    with caplog.at_level(logging.WARNING):
        refreshed = advisor.refresh(())
    broken, found = refreshed
    assert (broken.cluster, broken.pools, len(found.pools)) == ("broken", (), 7)
    assert broken.errors == (
        "cluster broken: discovery failed: RuntimeError: AccessDeniedException: ecs:DescribeClusters",
    )
    assert found.errors[0].startswith("cluster gpu-spot: spot prices of g6.xlarge")
    assert broken.errors[0] in caplog.text


def test_reconcile_counts_every_discovery_failure_and_no_job_failure():
    engine, _, _ = _engine(FakeJobStore(), FakeJobEcs())
    advisor = PlacementAdvisor(Book(), FakeJobStore(), lambda: NOW, clusters=("broken", "gpu-spot"))
    engine.placement = advisor
    jobs = JobService(
        engine, None, None, placement=advisor, pool_observations=advisor, retries=engine.retries
    )  # type: ignore[arg-type]
    counts = Reconciler(jobs, pool_observations=advisor).reconcile()
    assert (counts.pools, counts.discovery_errors, counts.failed) == (7, 2, 0)
