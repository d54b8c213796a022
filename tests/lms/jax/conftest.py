"""The JAX backend's tests run in their own pytest run, with KERAS_BACKEND=jax (``make test``)."""

import pytest

from tests.models import small_images as images


@pytest.fixture
def data():
    return images()
