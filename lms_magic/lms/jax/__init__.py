"""LMS on Keras's JAX backend: the values the backward pass keeps offloaded (or recomputed) by XLA under ``jax.checkpoint``."""
