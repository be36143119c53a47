"""Shared test configuration: Hypothesis profiles.

``HYPOTHESIS_PROFILE=thorough`` runs many more examples than the default profile
that ``make test`` uses.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local SparkSession for the whole test run (Spark takes ~10 s to start)."""
    from txstream.spark import local_session

    session = local_session("txstream-tests")
    yield session
    session.stop()
