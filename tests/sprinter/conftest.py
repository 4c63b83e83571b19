"""Fixtures shared by the SPRINTER tests (one torch thread comes from tests/conftest.py)."""

import pytest

from tests.engine.tiny import tiny_llama


@pytest.fixture(scope="module")
def pair():
    """A tiny target (2 layers) and draft (1 layer) sharing a vocabulary."""
    return tiny_llama(0), tiny_llama(5, layers=1)
