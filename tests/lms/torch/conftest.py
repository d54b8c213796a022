"""The PyTorch backend's tests run in their own pytest run, with KERAS_BACKEND=torch (``make test``)."""

import pytest
import torch

from tests.models import small_images as images


@pytest.fixture(autouse=True)
def deterministic_cudnn():
    """Exact equality on a GPU needs cuDNN to pick the same algorithms run after run (a no-op on the CPU)."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


@pytest.fixture
def data():
    return images()
