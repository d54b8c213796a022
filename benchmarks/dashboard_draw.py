"""How long the %%lms_fit dashboard takes to build after a long training: 10,000 steps per variant.

Trains a tiny model for STEPS steps per variant with `%%lms_fit --compare -o` on the
two logical CPUs (as the tests do), then times what happens once training has
ended: the dashboard's headline, figures (lines thinned to 2,000 points) and the
display bundles (plotly JSON and HTML, plotly.js inline once, as in each new cell), median of 5. Goal: under 1 s. The browser's
own drawing is not timed here (tests/test_browser.py checks that it draws).

    python benchmarks/dashboard_draw.py [--steps 10000]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from common import report, runs_figure  # noqa: E402


def main(steps: int) -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from IPython.testing.globalipapp import get_ipython

    from lms_magic.ui.dashboard import Dashboard

    shell = get_ipython()
    shell.run_line_magic("load_ext", "lms_magic")
    shell.run_cell("import keras, numpy as np\nx = np.random.default_rng(0).random((%d, 8), dtype='float32')\n"
                   "y = x.sum(axis=1)\nmodel = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), "
                   "keras.layers.Dense(1)])\nmodel.compile('sgd', 'mse')" % steps)
    result = shell.run_cell("%%lms_fit --compare -q -o --device /CPU:0 --host-device /CPU:1 --min-bytes 0\n"
                            "model.fit(x, y, batch_size=1, epochs=1, verbose=0)").result
    variants = result.variants
    print(f"steps per variant: {[v.steps for v in variants]}, memory samples: "
          f"{[len(v.memory.timeline.times_s) for v in variants]}")
    times = []
    for _ in range(5):
        shell.execution_count += 1  # a new cell, whose first figure carries plotly.js
        started = time.perf_counter()
        dashboard = Dashboard(result)
        dashboard.bundles()
        times.append(time.perf_counter() - started)
    points = max(len(trace.x) for figure in dashboard.figures for trace in figure.data if trace.x is not None)
    print(f"dashboard built in {statistics.median(times):.3f} s (median of 5; min {min(times):.3f}, "
          f"max {max(times):.3f}); longest drawn line {points} points (goal: < 1 s)")
    report([runs_figure(f"%%lms_fit dashboard built after {steps:,} steps a variant", times, "s", goal="< 1 s")])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10_000)
    main(parser.parse_args().steps)
