"""Property-based tests: hypothesis settings, and one system over moto shared by the package.

Profiles: `spotguard-dev` (random, so that new inputs are tried run after run) and `spotguard-ci`
(derandomized: the same examples every run, so a CI failure reproduces), chosen by CI=true. No example
database is written (failures print the `@reproduce_failure` blob instead). Each test sets its own
max_examples, sized so that the package runs in well under 90 s here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.integration.conftest import fresh_aws
from tests.property.harness import PropertyWorld

settings.register_profile(
    "spotguard-dev",
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile("spotguard-ci", parent=settings.get_profile("spotguard-dev"), derandomize=True)
settings.load_profile("spotguard-ci" if os.environ.get("CI") == "true" else "spotguard-dev")


@pytest.fixture(scope="package")
def system() -> Iterator[PropertyWorld]:
    with fresh_aws():
        yield PropertyWorld.build()
