"""Shared pytest fixtures and the ``torch`` marker."""

import importlib.util
import os

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "torch: needs torch (fspace.Laplace follows laplace-torch's API, whose hyperparameters and "
        "results are tensors); skipped without torch unless $FSPACE_REQUIRE_TORCH makes it a failure",
    )


def pytest_runtest_setup(item):
    """A test marked ``torch`` is skipped where torch is not installed (`cargo xtask test
    --no-torch`, or a disk too small for it), and fails there when ``$FSPACE_REQUIRE_TORCH`` is
    set, as the other torch tests do."""
    if item.get_closest_marker("torch") is None or importlib.util.find_spec("torch") is not None:
        return
    if os.environ.get("FSPACE_REQUIRE_TORCH"):
        pytest.fail("torch is required ($FSPACE_REQUIRE_TORCH) but not importable")
    pytest.skip("torch is not installed: fspace.Laplace's hyperparameters and results are torch tensors")


@pytest.fixture
def one_torch_thread():
    """Runs a test on one torch thread: a step of a small net is under a millisecond alone,
    but torch's two spinning threads beside any other busy process made it 64 ms here."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
