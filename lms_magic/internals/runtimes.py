"""Whether TensorFlow's and JAX's runtimes have started, asked without starting them (asking would fix
TensorFlow's GPU settings and make JAX take GPU memory)."""

from __future__ import annotations

def tensorflow_started(modules) -> bool:
    """Whether TensorFlow's runtime has started (asking it anything would start it and fix its GPU settings)."""
    context_module = modules.get("tensorflow.python.eager.context")
    return context_module is not None and bool(getattr(context_module.context(), "_initialized", False))


def jax_started(modules) -> bool:
    """Whether JAX's backends exist (asking for devices would create them and take GPU memory)."""
    bridge = modules.get("jax._src.xla_bridge")
    return bridge is not None and bool(getattr(bridge, "_backends", None))
