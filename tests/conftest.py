import pytest

from verispec.models.toy import ToyDraft, ToyModel


def toy_pair(vocab_size: int, seed: int = 0, zero_frac: float = 0.25, mix: float = 0.4):
    """Target and draft toy models with exact zeros in both (ALGORITHMS.md §14.1 item 2)."""
    target = ToyModel(vocab_size, seed=seed, zero_frac=zero_frac)
    draft = ToyDraft(target, seed=seed + 1000, zero_frac=zero_frac, mix=mix)
    return target, draft


@pytest.fixture
def make_toy_pair():
    return toy_pair
