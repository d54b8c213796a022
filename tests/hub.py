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


def skip_where_tensorflow_cannot_run_bfloat16() -> None:
    """Skips the test where TensorFlow's oneDNN (which the tests turn on) has no bfloat16 matmul: a CPU, or a
    ``ONEDNN_MAX_CPU_ISA`` cap, without AVX-512. TensorFlow aborts the process there ("could not create a primitive
    descriptor for the matmul primitive"); where it picks its kernels itself it leaves oneDNN off on such CPUs."""
    import os

    import keras

    if keras.backend.backend() != "tensorflow" or os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "1":
        return
    from lms_magic.memory.machine import cpu_name

    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    if "AVX-512" not in cpu_name() or not cap.startswith(("ALL", "AVX512", "AVX10", "AVX2_VNNI_2", "AMX")):
        pytest.skip(f"TensorFlow's oneDNN has no bfloat16 matmul on this CPU ({cpu_name()}, oneDNN's ISA {cap})")


CAUSAL_LMS = {"gemma": ("GemmaBackbone", "GemmaCausalLM"), "llama": ("LlamaBackbone", "LlamaCausalLM"),
              "mistral": ("MistralBackbone", "MistralCausalLM")}


def causal_lm(family: str = "gemma", seed: int = 1, layers: int = 2, hidden: int = 64, vocabulary: int = 512,
              dtype: str = "float32"):
    """A KerasHub causal LM of ``family`` from a config (4 query / 1 key-value heads), no preprocessor, LoRA of
    rank 4 on its backbone, compiled as KerasHub's fine-tuning guides do: AdamW, a weighted sparse-categorical
    accuracy; under the ``dtype`` policy (``mixed_bfloat16`` for mixed precision), set back after building."""
    keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is installed by `make install` (no-deps)")
    import keras

    if "bfloat16" in dtype:
        skip_where_tensorflow_cannot_run_bfloat16()
    backbone_class, task_class = (getattr(keras_hub.models, name) for name in CAUSAL_LMS[family])
    keras.utils.set_random_seed(seed)
    size = dict(vocabulary_size=vocabulary, num_layers=layers, num_query_heads=4, num_key_value_heads=1,
                hidden_dim=hidden, intermediate_dim=2 * hidden)
    size.update(head_dim=hidden // 4) if family == "gemma" else size.update(rope_max_wavelength=10000)
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(dtype)
    try:
        backbone = backbone_class(**size)
        model = task_class(backbone=backbone, preprocessor=None)
        backbone.enable_lora(4)
        model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()])
    finally:
        keras.mixed_precision.set_global_policy(policy)
    return model


def lm_data(n: int = 32, sequence: int = 64, vocabulary: int = 512, seed: int = 0):
    """Token ids and a padding mask (the last quarter padded), next-token labels, and the mask as sample weights:
    ``(x, y, sample_weight)`` as a fine-tuning loop passes them."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocabulary, (n, sequence)).astype("int32")
    mask = np.ones_like(ids)
    mask[:, sequence * 3 // 4:] = 0
    return {"token_ids": ids, "padding_mask": mask}, np.roll(ids, -1, axis=1), mask.astype("float32")


def text_causal_lm(seed: int = 1, sequence: int = 32):
    """A GPT-2-style causal LM with its preprocessor (a byte-level BPE tokenizer over the letters, no download),
    LoRA of rank 4, compiled as ``causal_lm``: its ``fit`` takes text. Needs tensorflow-text (KerasHub tokenizes
    through it on every backend)."""
    keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is installed by `make install` (no-deps)")
    pytest.importorskip("tensorflow_text", reason="tensorflow-text is installed by `make install` (no-deps)")
    import keras

    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens = ["<|endoftext|>", "Ġ", *letters, *("Ġ" + letter for letter in letters), "th", "Ġt", "Ġth", "Ġthe"]
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary={token: i for i, token in enumerate(tokens)},
                                               merges=["t h", "Ġ t", "Ġt h", "Ġth e"])
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=len(tokens), num_layers=2, num_heads=2, hidden_dim=32,
                                             intermediate_dim=64, max_sequence_length=sequence)
    model = keras_hub.models.GPT2CausalLM(
        backbone=backbone, preprocessor=keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=sequence))
    backbone.enable_lora(4)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()])
    return model


def texts(n: int = 32, seed: int = 0) -> list[str]:
    """``n`` sentences of ten words each: a text causal LM's ``x``."""
    rng = np.random.default_rng(seed)
    words = "the quick brown fox jumps over the lazy dog".split()
    return [" ".join(rng.choice(words, 10)) for _ in range(n)]


def text_classifier(seed: int = 1, classes: int = 3):
    """A BERT-style text classifier from a config, no preprocessor (token ids in), compiled with an accuracy."""
    keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is installed by `make install` (no-deps)")
    import keras

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=32,
                                             intermediate_dim=64, max_sequence_length=64)
    model = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=classes, preprocessor=None)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["sparse_categorical_accuracy"])
    return model


def labelled_tokens(n: int = 32, sequence: int = 64, classes: int = 3, seed: int = 0):
    """BERT's inputs (token ids, a padding mask, segment ids) and a class label each."""
    x, _ = tokens("bert", n=n, sequence=sequence)
    return x, np.random.default_rng(seed).integers(0, classes, n)


def dashboard_of_a_lora_fine_tuning(shell):
    """``%%lms_fit --compare`` over a small causal LM with LoRA fit on ``(x, y, sample_weight)``, every candidate
    moved: the result, after checking what every backend's dashboard must show (the weighted accuracy both ways,
    the same; the samples a second)."""
    shell.user_ns.update(causal_lm=causal_lm, data=lm_data(n=16, sequence=32))
    result = shell.run_cell_magic("lms_fit", "--compare -q -o --n-tensors -1 --min-bytes 0", (
        "model = causal_lm(layers=1, hidden=32)\n"
        "x, y, weights = data\n"
        "model.fit(x, y, sample_weight=weights, batch_size=8, verbose=0)\n"))
    plain, lms = result.variants
    assert plain.status == lms.status == "ok" and lms.lms_stats["swapped_tensors"] > 0
    rows = {row[0]: row[1:] for row in result.table()}
    accuracy = rows["final sparse_categorical_accuracy"]
    assert "-" not in accuracy[:2] and accuracy[0] == accuracy[1], rows
    assert "-" not in rows["samples/s"][:2], rows
    return result
