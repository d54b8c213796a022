"""LMS on Keras's JAX backend: layer outputs offloaded (or recomputed) by XLA under ``jax.checkpoint``."""
