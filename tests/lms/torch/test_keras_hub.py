"""KerasHub's GPT-2 backbone (built from a config) trained with LMS on the PyTorch backend: the same losses and
weights as a plain fit, every saved activation offloaded."""

import re

import numpy as np
import pytest

from lms_magic import LMS
from tests.hub import fit_both


def test_a_kerashub_backbone_trains_as_without_lms():
    callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
    (plain_loss, plain_weights), (loss, weights) = fit_both("gpt2", callback, sequence=64)
    assert loss == plain_loss
    assert all(np.array_equal(a, b) for a, b in zip(plain_weights, weights))
    stats = callback.stats
    assert stats.swapped_tensors > 0 and stats.device_peak_bytes < stats.device_peak_bytes_without_lms


@pytest.mark.parametrize("family, dtype", [("gemma", "float32"), ("gemma", "mixed_bfloat16"), ("llama", "float32")])
def test_lora_fine_tuning_with_sample_weights_trains_as_without_lms(family, dtype):
    """A KerasHub causal LM with LoRA, ``(dict of inputs, labels, sample_weight)``: every candidate moved, the same
    losses, weights and weighted accuracy as a plain fit, and LMS's step-time probe reads the dict of inputs."""
    from tests.hub import causal_lm, lm_data

    fitted = []
    for callbacks in ([], [LMS(n_tensors=-1, min_bytes=0, verbose=0)]):
        model = causal_lm(family, dtype=dtype)
        x, y, weights = lm_data()
        history = model.fit(x, y, sample_weight=weights, batch_size=8, epochs=1, verbose=0, shuffle=False,
                            callbacks=callbacks)
        fitted.append((history.history, model.get_weights(), callbacks))
    (plain, plain_weights, _), (with_lms, weights, (callback,)) = fitted
    assert with_lms == plain and "sparse_categorical_accuracy" in plain
    assert all(np.array_equal(a, b) for a, b in zip(plain_weights, weights))
    stats = callback.stats
    assert stats.swapped_tensors > 0 and stats.device_peak_bytes < stats.device_peak_bytes_without_lms
    assert stats.compute_s is not None and not [note for note in stats.notes if "no step-time" in note], stats.notes


def test_explain_fit_reads_a_dict_of_inputs_with_sample_weights():
    import lms_magic
    from tests.hub import causal_lm, lm_data

    found = lms_magic.explain_fit(causal_lm(), lm_data(), batch_size=8, capacity="64MiB",
                                  modes=("without LMS", "LMS"))
    assert found.peak["bytes"] > 0 and found.modes[0].largest_batch > 0
    # named by path as on TensorFlow and JAX: each block's attention softmax under its block; the loss as such
    names = [row["layer"] for row in found.peak["layers"]]
    assert any(re.fullmatch(r"gemma_backbone(_\d+)?/decoder_block_0/attention/softmax(_\d+)?", name) for name in names), names
    assert "loss" in names and "(no layer)" not in names, names
    assert found.modes[1].largest_batch >= found.modes[0].largest_batch
    # no GPU here: the capacity given is one LMS would not find by itself, so its line carries the budget
    assert found.modes[1].magic == "%%lms_fit --budget 51MiB"


def test_lms_leaves_keras_dispatching_batch_ends_asynchronously():
    """Keras runs the batch-end hooks of a fit on a worker thread where every callback allows it; LMS has no
    batch-end hook of its own, so a user's async-safe callback still runs off the training thread."""
    import threading

    import keras

    from tests.models import compiled, mlp, vectors

    class Where(keras.callbacks.Callback):
        async_safe = True

        def __init__(self):
            super().__init__()
            self.threads = set()

        def on_train_batch_end(self, batch, logs=None):
            self.threads.add(threading.current_thread() is threading.main_thread())

    where = Where()
    compiled(mlp()).fit(*vectors(64), batch_size=16, verbose=0, callbacks=[where, LMS(min_bytes=0, verbose=0)])
    assert where.threads == {False}


def test_batch_size_max_sizes_text_through_the_preprocessor_within_the_cells_budget(shell, capsys):
    """``%%lms_fit --batch-size max`` over a KerasHub causal LM fed a list of text (its preprocessor tokenizes it,
    as its ``fit`` does): on a CPU no device capacity is known, so the magic asks for ``--budget``; with one, it
    sizes the batch within it and trains, one step of all the samples where the largest batch holds more."""
    from tests.hub import text_causal_lm, texts

    shell.user_ns.update(model=text_causal_lm(), x=texts(16))
    with pytest.raises(ValueError, match=r"no device capacity known .* put --budget 12GiB"):
        shell.run_cell_magic("lms_fit", "--batch-size max -q", "model.fit(x, epochs=1, verbose=0)")
    outcome = shell.run_cell("%%lms_fit --batch-size max --budget 32MiB -o\nhistory = model.fit(x, epochs=1, verbose=0)")
    assert outcome.success, outcome.error_in_exec
    printed = capsys.readouterr().out
    chosen = int(re.search(r"--batch-size max: batch (\d+)", printed).group(1))
    (variant,) = shell.user_ns["_"].variants
    assert variant.status == "ok" and np.isfinite(shell.user_ns["history"].history["loss"]).all()
    # 32 MiB holds far more than the 16 samples of this small model: all of them in one step
    assert chosen > 16 and variant.batch_size == 16 and variant.steps == 1
    assert "the data holds 16 samples: batch 16, one step an epoch" in printed
    assert variant.lms_stats["device_peak_bytes"] <= 32 * 2**20


def test_the_dashboard_compares_a_lora_fine_tunings_weighted_accuracy_and_speed(shell):
    """``%%lms_fit --compare`` over a KerasHub causal LM with LoRA fit on ``(x, y, sample_weight)``: every
    candidate moved, the dashboard compares the weighted accuracy both ways (the same), and the samples a second."""
    from tests.hub import dashboard_of_a_lora_fine_tuning

    dashboard_of_a_lora_fine_tuning(shell)
