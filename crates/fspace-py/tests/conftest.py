"""Shared pytest fixtures."""

import pytest


@pytest.fixture
def one_torch_thread():
    """Runs a test on one torch thread: a step of a small net is under a millisecond alone,
    but torch's two spinning threads beside any other busy process made it 64 ms here."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
