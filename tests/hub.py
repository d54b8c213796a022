"""KerasHub backbones built from a config (no download), as users of its language models train them: a
language-model head on GPT-2's or BERT's sequence output, AdamW. The same code on every Keras backend."""

from __future__ import annotations

import numpy as np
import pytest

VOCABULARY = 1000


def language_model(kind: str = "gpt2", seed: int = 1, layers: int = 2, hidden: int = 64, sequence: int = 128):
    """A small ``kind`` ("gpt2" or "bert") backbone (4 heads, a feed-forward 4x ``hidden``) with a Dense head over
    the vocabulary, compiled."""
    keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is installed by `make install` (no-deps)")
    import keras

    keras.utils.set_random_seed(seed)
    config = dict(vocabulary_size=VOCABULARY, num_layers=layers, num_heads=4, hidden_dim=hidden,
                  intermediate_dim=4 * hidden, max_sequence_length=sequence)
    backbone = (keras_hub.models.GPT2Backbone if kind == "gpt2" else keras_hub.models.BertBackbone)(**config)
    outputs = backbone(backbone.input)
    sequence = outputs["sequence_output"] if isinstance(outputs, dict) else outputs
    model = keras.Model(backbone.input, keras.layers.Dense(VOCABULARY)(sequence))
    model.compile(keras.optimizers.AdamW(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def tokens(kind: str = "gpt2", n: int = 16, sequence: int = 128):
    """Random token ids (and the masks the backbone takes), and next-token labels."""
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, VOCABULARY, (n, sequence)), "padding_mask": np.ones((n, sequence), "int32")}
    if kind == "bert":
        x["segment_ids"] = np.zeros((n, sequence), "int32")
    return x, rng.integers(0, VOCABULARY, (n, sequence))


def fit_both(kind: str, callback, epochs: int = 1, **size):
    """A plain fit and one with ``callback`` from the same seed, batch 8 (``size``: ``language_model``'s
    ``layers``, ``hidden``, ``sequence``); their (losses, weights) each."""
    fitted = []
    for callbacks in ([], [callback]):
        model = language_model(kind, **size)
        history = model.fit(*tokens(kind, sequence=size.get("sequence", 128)), batch_size=8, epochs=epochs,
                            verbose=0, shuffle=False, callbacks=callbacks)
        fitted.append((history.history["loss"], model.get_weights()))
    return fitted
