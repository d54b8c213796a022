"""LMS on Keras's JAX backend: not yet. What is missing, said exactly.

JAX can offload saved residuals itself: ``jax.checkpoint`` with the policy
``jax.checkpoint_policies.save_and_offload_only_these_names(..., offload_src="device",
offload_dst="pinned_host")`` moves the activations named with
``jax.ad_checkpoint.checkpoint_name`` to pinned host memory and back. Using it
from Keras needs two things that Keras 3's JAX trainer does not expose: a way
to wrap ``compute_loss_and_updates`` (which its jitted ``train_step`` passes to
``jax.value_and_grad``) in ``jax.checkpoint``, and a way to name each layer's
output with ``checkpoint_name`` inside the traced call. Patching both is
possible, but it could not be checked on a GPU while this was written, so
``LMS`` refuses the JAX backend instead of pretending.
"""

from __future__ import annotations


def unsupported_message(backend: str) -> str:
    """The error ``LMS`` raises on a backend it cannot offload on.

    Example:
        >>> "KERAS_BACKEND=torch" in unsupported_message("jax")
        True
    """
    if backend == "jax":
        return ("LMS does not offload on Keras's JAX backend yet: Keras's JAX trainer gives no hook to wrap "
                "compute_loss_and_updates in jax.checkpoint with an offload policy "
                "(jax.checkpoint_policies.save_and_offload_only_these_names, offload_dst='pinned_host') nor to "
                "name layer outputs with checkpoint_name. Train with KERAS_BACKEND=torch or tensorflow, or call "
                "jax.checkpoint with that policy in your own JAX training loop.")
    return (f"LMS runs on Keras's TensorFlow and PyTorch backends; this Keras uses {backend!r}: set "
            "KERAS_BACKEND=torch or tensorflow before importing keras")
