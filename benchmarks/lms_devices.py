"""LMS on several devices: the per-device figures the tests check, as a table.

- JAX, keras.distribution on 1, 2 and 4 of 4 host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``):
  a 4-layer CNN (24x24, batch 16, SGD) with every layer output offloaded: bytes offloaded per device, the
  predicted per-device peak with and without LMS, the variables per device; DataParallel, and a 2x2
  (batch, model) ModelParallel MLP with every kernel and bias sharded over "model".
- TensorFlow, MirroredStrategy over ``simulate_accelerator(accelerators=2)``: each device's predicted peak
  with and without LMS, and whether the losses and weights match a plain fit under the strategy to the bit.

The scripts are the tests' own (tests/lms/jax/test_distribution.py, tests/lms/tensorflow/test_strategies.py).

    python benchmarks/lms_devices.py
"""

from __future__ import annotations

import sys

from common import CODE, Figure, report

sys.path.insert(0, str(CODE))


def main() -> None:
    import os

    from tests.lms.jax.distribution import run as run_jax

    os.environ["KERAS_BACKEND"] = "jax"
    found_jax = run_jax(4)
    runs = {count: {"data_parallel": found_jax[f"data_parallel_{count}"]} for count in (2, 4)}
    runs[4]["model_parallel"] = found_jax["model_parallel"]
    one = found_jax["one_device"]
    print("JAX, keras.distribution, every layer output offloaded (bytes per device)")
    print(f"{'layout':<28}{'offloaded':>11}{'x N / one':>10}{'peak with':>11}{'without':>10}{'variables':>11}  same loss, weights")
    rows = [("one device", one, 1)] + [(f"DataParallel, {n} devices", runs[n]["data_parallel"], n) for n in (2, 4)]
    rows.append(("ModelParallel 2x2", runs[4]["model_parallel"], None))
    for name, run, count in rows:
        ratio = f"{run['moved_bytes'] * count / one['moved_bytes']:.3f}" if count else "-"
        print(f"{name:<28}{run['moved_bytes']:>11}{ratio:>10}{run['peak']:>11}{run['peak_without']:>10}"
              f"{run['persistent']:>11}  {run['same_loss']}, {run['same_weights']}")
    parallel = runs[4]["model_parallel"]
    print(f"ModelParallel: variables per device {parallel['persistent']} of {parallel['all_persistent']} "
          f"({parallel['persistent'] / parallel['all_persistent']:.3f})")
    figures = [Figure(f"JAX DataParallel on {n} host devices, every layer output offloaded: bytes offloaded per device "
                      "x N over one device's", "one fit", round(runs[n]["data_parallel"]["moved_bytes"] * n /
                                                             one["moved_bytes"], 3), "x") for n in (2, 4)]
    figures += [Figure(f"JAX {name}: losses and weights identical to plain under the same layout", "1 yes, 0 no",
                       int(run["same_loss"] and run["same_weights"]), "") for name, run, _ in rows[1:]]

    os.environ["KERAS_BACKEND"] = "tensorflow"
    from tests.lms.tensorflow.strategies import mirrored_fits

    found = mirrored_fits()
    print("\nTensorFlow, MirroredStrategy over 2 simulated accelerators (bytes per device)")
    for label, peaks in (("n_tensors=-1", found["device_peaks"]), ("default plan", found["planned_peaks"])):
        for device, peak in peaks.items():
            print(f"{label:<14}{device:<8} predicted peak {peak['with_lms']:>9} with LMS, {peak['without_lms']:>9} without")
    print(f"swapped per device: {found['swapped']} of {found['candidates']}; losses identical: {found['same_loss']}, "
          f"weights identical: {found['same_weights']}")
    print(found["summary"].splitlines()[0])
    figures.append(Figure("TensorFlow MirroredStrategy over 2 simulated accelerators: losses and weights identical to "
                          "plain (reproducible mode)", "1 yes, 0 no", int(found["same_loss"] and found["same_weights"]), ""))
    report(figures)


if __name__ == "__main__":
    main()
