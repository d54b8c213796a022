"""Large Model Support: activations wait in host memory between the forward and the backward pass.

``callback.py`` is the Keras callback users add (``LMS``). It asks the chosen framework (``framework.py``:
devices, capacity, what it does not honour) and drives one backend per fit (``backend.py``'s protocol):
``tensorflow/`` (graph rewrite and replay), ``torch/`` (saved-tensor hooks), ``jax/`` (``jax.checkpoint``
with an offload policy). Every backend plans with the pure core (``core/``: plan, liveness replay, search,
peak, stats, summary, prediction), which imports no framework and knows no op names.
"""
