"""Shared test configuration: hypothesis profiles and torch threading."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("default", deadline=None, max_examples=50,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, max_examples=30, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "default")

# pytest-xdist runs one worker per core; keep each worker single-threaded so they do not contend.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a test module (``pytestmark = pytest.mark.usefixtures("one_thread")``): small
    batched tensors are overhead-bound, and on 2 shared cores torch's default thread pool oversubscribes them
    (>10x slower here); the previous setting is restored afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
