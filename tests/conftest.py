import pytest
import torch

from verispec.models.toy import ToyDraft, ToyModel


@pytest.fixture(autouse=True, scope="session")
def single_thread_torch():
    """One torch thread for the whole suite: the tiny test models run fastest on one thread, and
    CI's two cores are then not oversubscribed."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def toy_pair(vocab_size: int, seed: int = 0, zero_frac: float = 0.25, mix: float = 0.4):
    """Target and draft toy models with exact zeros in both (ALGORITHMS.md §14.1 item 2)."""
    target = ToyModel(vocab_size, seed=seed, zero_frac=zero_frac)
    draft = ToyDraft(target, seed=seed + 1000, zero_frac=zero_frac, mix=mix)
    return target, draft


@pytest.fixture
def make_toy_pair():
    return toy_pair
