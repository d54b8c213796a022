"""LMS under ``keras.distribution`` on JAX: the devices a step runs on, and what one of them holds.

Keras jits the train step over the distribution's device mesh: the batch is split along the mesh's batch axis
(``DataParallel``: every device; ``ModelParallel``: its ``batch_dim_name`` axis), and each variable is laid out
as its ``LayoutMap`` says (replicated where it says nothing). LMS plans for one device: the step traced at the
per-device batch, the variables counted by their per-device shards, and the values computed from split variables
by one device's part (``sharded.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeshLayout:
    """The distribution's devices, and how many ways it splits the batch (``residuals.per_device_specs``).

    Example:
        >>> MeshLayout(("cpu:0", "cpu:1"), 2).batch_shards
        2
    """

    devices: tuple[str, ...]
    batch_shards: int


def mesh_layout() -> MeshLayout | None:
    """The layout of the distribution set with ``keras.distribution.set_distribution``, or None where none is."""
    import keras
    import numpy as np

    distribution = keras.distribution.distribution()
    if distribution is None:
        return None
    mesh = distribution.device_mesh
    names, shape = list(mesh.axis_names), list(mesh.shape)
    batch_axis = getattr(distribution, "batch_dim_name", None)
    shards = shape[names.index(batch_axis)] if batch_axis in names else 1
    return MeshLayout(tuple(str(device) for device in np.ravel(mesh.devices)), int(shards))


def shard_shape(variable) -> tuple[int, ...]:
    """The shape of the part of ``variable`` one device holds (its whole shape where it is not sharded)."""
    value = getattr(variable, "value", None)
    try:
        return tuple(int(dim) for dim in value.sharding.shard_shape(tuple(value.shape)))
    except Exception:  # not a sharded array (a tracer, a variable not yet placed): all of it
        return tuple(int(dim) for dim in variable.shape)
