"""Make the shared test helpers (tests/harness.py) importable as ``harness``; the ``device`` fixture.

``device`` runs a test on "cpu" and on "cuda"; the cuda run is skipped, with the
reason the cuda backend gives, where it cannot run (no CuPy, no GPU, no cuDNN binding).
"""
import functools
import os
import sys

import minidnn  # noqa: F401  first: it sets OpenBLAS's thread timeout, which OpenBLAS reads when NumPy loads it
import pytest

sys.path.insert(0, os.path.dirname(__file__))


@functools.lru_cache(maxsize=None)
def cuda_unavailable_reason():
    """None where the cuda backend can run, else why not (looked at once per test session)."""
    from minidnn.backend.cuda import status
    s = status()
    return None if s.available else "cuda backend unavailable: " + "; ".join(s.problems)


@pytest.fixture(params=["cpu", "cuda"], ids=["cpu", "cuda"])
def device(request):
    if request.param == "cuda" and cuda_unavailable_reason():
        pytest.skip(cuda_unavailable_reason())
    return request.param
