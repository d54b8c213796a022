"""LMS on Keras's JAX backend: not yet (backend.py says why)."""
