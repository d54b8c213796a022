"""The fits under tf.distribute that ``test_strategies.py`` (and ``benchmarks/lms_devices.py``) read: one fresh
process on ``simulate_accelerator(accelerators=2)``, TensorFlow made reproducible (oneDNN off, op determinism)."""

import json
import os
import subprocess
import sys
import textwrap

SETUP = textwrap.dedent("""
    import json, os
    import lms_magic
    lms_magic.simulate_accelerator(accelerators=2)
    import keras, numpy as np, tensorflow as tf
    from lms_magic import LMS
    from lms_magic.lms.options import OptionError
    tf.config.experimental.enable_op_determinism()
    strategy = tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"])

    def build():
        keras.utils.set_random_seed(3)
        with strategy.scope():
            inputs = keras.Input((24, 24, 3))
            x = keras.layers.Dense(8, activation="relu")(inputs)  # no kernel scratch (a convolution's gradient
            y = keras.layers.Dense(8, activation="relu")(x)  # holds 32 MiB with oneDNN off, its activations 0.3)
            x = keras.layers.BatchNormalization()(keras.layers.Add()([x, y]))
            x = keras.layers.Dense(8, activation="relu")(x)
            outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))
            model = keras.Model(inputs, outputs)
            model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 24, 24, 3), dtype="float32"), rng.integers(0, 10, 64)

    def fit(callbacks=()):
        model = build()
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False, callbacks=list(callbacks))
        return model, history.history["loss"]
""")


def run(body: str) -> dict:
    """Runs SETUP and ``body`` in a fresh Python; ``body`` prints one JSON line last."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
    done = subprocess.run([sys.executable, "-c", SETUP + textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def mirrored_fits() -> dict:
    """One process: plain and LMS fits under MirroredStrategy over two simulated accelerators, the devices LMS
    refuses there, and %%lms_fit --compare in an IPython shell: what the tests read."""
    return run("""
        plain, plain_loss = fit()
        callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
        lms, lms_loss = fit([callback])
        again = LMS(min_bytes=0, verbose=0)  # the default plan: a probe, then the plan
        fit([again])
        stats = callback.stats
        found = {
            "same_loss": plain_loss == lms_loss, "loss": lms_loss,
            "same_weights": all(np.array_equal(a, b) for a, b in zip(plain.get_weights(), lms.get_weights())),
            "devices": stats.devices, "summary": callback.summary(),
            "swapped": stats.swapped_tensors, "candidates": stats.candidates,
            "swap_outs": [r.swap_out for r in stats.records], "device_peaks": stats.device_peaks,
            "planned_devices": again.stats.devices, "planned_swap_outs": [r.swap_out for r in again.stats.records],
            "planned_peaks": again.stats.device_peaks}
        found["modes"] = {}
        for mode in ("only", True):  # recompute only, and the hybrid plan (recomputes on the first replica)
            moved = LMS(n_tensors=-1, min_bytes=0, verbose=0, recompute=mode)
            model, mode_loss = fit([moved])
            found["modes"][str(mode)] = {
                "same": mode_loss == plain_loss and all(np.array_equal(a, b) for a, b in zip(plain.get_weights(),
                                                                                             model.get_weights())),
                "recomputed": moved.stats.recomputed_tensors, "records": len(moved.stats.records)}
        given = LMS(n_tensors=-1, min_bytes=0, verbose=0, device="/CPU:1")  # the second replica's device, named
        fit([given])
        found["given"] = {"devices": given.stats.devices, "peak": given.stats.device_peak_bytes,
                          "without": given.stats.device_peak_bytes_without_lms, "peaks": given.stats.device_peaks}

        model = build()
        before = [w.copy() for w in model.get_weights()]
        found["refused"] = {}
        for options in ({"host_device": "/CPU:1"}, {"device": "/CPU:2"}):
            try:
                model.fit(x, y, batch_size=16, verbose=0, callbacks=[LMS(verbose=0, **options)])
            except OptionError as error:
                found["refused"][str(options)] = str(error)
        found["unchanged"] = all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
        found["train_step"] = "train_step" in model.__dict__

        from IPython.core.interactiveshell import InteractiveShell
        from lms_magic.ui.plots import memory_bars_figure
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "lms_magic")
        shell.user_ns.update(build=build, x=x, y=y)
        shell.run_cell("model = build()")
        cell = shell.run_cell("%%lms_fit --compare -o -q --n-tensors -1 --min-bytes 0\\n"
                              "model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)")
        found["magic_error"] = repr(cell.error_in_exec)
        found["headline"] = cell.result.headline() if cell.result is not None else None
        found["bars"] = {} if cell.result is None else {
            trace.name: list(trace.x) for trace in memory_bars_figure(cell.result.variants).data if trace.xaxis == "x"}
        print(json.dumps(found))
    """)
