import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def single_thread_torch():
    """Tiny models run fastest on one thread; the machine's cores are shared."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
