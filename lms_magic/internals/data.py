"""A fit's data as Keras's own adapters read it, and whether a ``tf.data`` pipeline reshuffles each pass."""

from __future__ import annotations

def reshuffles_each_iteration(data) -> bool:
    """Whether ``data`` is a tf.data pipeline with a shuffle that draws a new order for each pass.

    Such a shuffle keeps its seed state inside the dataset, beyond
    ``keras.utils.set_random_seed``: two passes from the same seed see
    different orders (measured with and without ``seed=``).
    """
    if not type(data).__module__.startswith("tensorflow"):
        return False
    pending, seen = [data], set()
    while pending:
        dataset = pending.pop()
        if id(dataset) in seen:
            continue
        seen.add(id(dataset))
        if getattr(dataset, "_reshuffle_each_iteration", False) is True:
            return True
        inputs = getattr(dataset, "_inputs", None)
        if callable(inputs):
            try:
                pending.extend(inputs())
            except Exception:  # a dataset kind without inputs to walk
                pass
    return False


def numpy_batches(x, y=None, sample_weight=None, class_weight=None):
    """The batches ``fit(x, y, sample_weight=..., class_weight=...)`` trains on, as NumPy, from Keras's own data
    adapter: arrays (in batches of Keras's default 32), dicts of arrays, ``tf.data``, ``PyDataset``, grain
    datasets, whatever Keras accepts. Each is ``x`` or ``(x, y)`` or ``(x, y, sample_weight)``."""
    from keras.src.trainers.data_adapters import get_data_adapter

    adapter = get_data_adapter(x, y=y, sample_weight=sample_weight, class_weight=class_weight, shuffle=False)
    return adapter.get_numpy_iterator()
