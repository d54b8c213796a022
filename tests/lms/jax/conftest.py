"""The JAX backend's tests run in their own pytest run, with KERAS_BACKEND=jax (``make test``)."""

import pytest

from ..torch.models import images


@pytest.fixture
def data():
    return images()
