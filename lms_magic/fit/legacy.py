"""``fit_generator``, which Keras 3 removed, mapped onto ``fit``."""

from __future__ import annotations

import warnings

_QUEUE_DEFAULTS = {"max_queue_size": 10, "workers": 1, "use_multiprocessing": False}


def fit_generator(model, generator, steps_per_epoch=None, epochs=1, verbose=1, callbacks=None,
                  validation_data=None, validation_steps=None, validation_freq=1, class_weight=None,
                  max_queue_size=10, workers=1, use_multiprocessing=False, shuffle=True, initial_epoch=0):
    """Runs ``model.fit`` with the arguments of the old ``Model.fit_generator``.

    Keras 3 reads Python generators, ``keras.utils.PyDataset`` and ``tf.data``
    through ``fit`` itself. ``shuffle`` shuffles the batches of a
    ``PyDataset`` (Keras 2 shuffled only a ``Sequence``); other data is
    passed on without it, so Keras does not warn that it ignores it. The queue arguments (``max_queue_size``,
    ``workers``, ``use_multiprocessing``) moved to ``PyDataset``; values other
    than the defaults give a warning and are otherwise ignored.

    Returns:
        The ``History`` that ``fit`` returns.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> def batches():
        ...     while True:
        ...         yield np.ones((8, 3)), np.ones((8, 1))
        >>> fit_generator(model, batches(), steps_per_epoch=4, epochs=2, verbose=0).params["steps"]
        4
    """
    queue = {"max_queue_size": max_queue_size, "workers": workers, "use_multiprocessing": use_multiprocessing}
    changed = [name for name, value in queue.items() if value != _QUEUE_DEFAULTS[name]]
    if changed:
        warnings.warn(f"fit_generator: {', '.join(changed)} are ignored under Keras 3; "
                      "set them on a keras.utils.PyDataset instead", stacklevel=2)
    import keras

    shuffle = bool(shuffle) and isinstance(generator, keras.utils.PyDataset)
    return model.fit(generator, steps_per_epoch=steps_per_epoch, epochs=epochs, verbose=verbose,
                     callbacks=callbacks, validation_data=validation_data, validation_steps=validation_steps,
                     validation_freq=validation_freq, class_weight=class_weight, shuffle=shuffle,
                     initial_epoch=initial_epoch)
