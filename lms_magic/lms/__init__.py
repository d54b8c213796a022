"""Large Model Support: activations wait in host memory between the forward and the backward pass.

``callback.py`` is the Keras callback users add (``LMS``); it drives one backend per framework
(``tensorflow/``: graph rewrite and replay; ``torch/``: saved-tensor hooks; ``jax/``: ``jax.checkpoint``
with an offload policy) over the pure planning core (``core/``: plan, liveness replay, search, peak, stats,
prediction), which imports no framework and knows no op names.
"""
