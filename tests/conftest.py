"""Fixtures shared by several test modules."""

import pytest


@pytest.fixture
def latency_plus_bytes_allreduce(monkeypatch):
    """The latency-plus-bytes all-reduce form, which every GPU without a measured all-reduce table prices with: MI300X
    and MI325X price from their measured latencies as shipped (step_cost.ALLREDUCE_MEASURED_LATENCY,
    tests/test_allreduce_latency.py), so modules that test the form on MI300X turn the switch off with this."""
    from capacity.cost import step_cost
    monkeypatch.setattr(step_cost, "ALLREDUCE_MEASURED_LATENCY", False)
