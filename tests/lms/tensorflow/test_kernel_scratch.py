"""Each kernel's scratch, read off TensorFlow's allocator while a step runs, in LMS's figures and explain_fit's.

TensorFlow's float64 convolutions run its own kernels on any x86 CPU (oneDNN takes float32 and bfloat16): the filter
gradient allocates blocking buffers of tens of MiB, sized from the CPU's caches, that the graph's tensors do not show
(where oneDNN is off, or on an AVX2 machine, float32's do too). The figures are held to the allocator's measured
peak of the same steps.
"""

import keras
import numpy as np
import tensorflow as tf

from lms_magic import LMS, explain_fit
from lms_magic.memory.frameworks import resettable_counter
from lms_magic.sizing.measured import StepPeaks
from tests.conftest import DEVICES

SIZE, BATCH = 48, 8


def float64_cnn():
    keras.utils.set_random_seed(3)
    layers = keras.layers
    model = keras.Sequential([keras.Input((SIZE, SIZE, 3))]
                             + [layers.Conv2D(16, 3, padding="same", activation="relu", dtype="float64")
                                for _ in range(3)]
                             + [layers.GlobalAveragePooling2D(dtype="float64"), layers.Dense(10, dtype="float64")])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def images(count: int):
    rng = np.random.default_rng(0)
    return rng.random((count, SIZE, SIZE, 3)), rng.integers(0, 10, count)


def measured_step_bytes(model, batch: int) -> int:
    """The allocator's peak of plain steps at ``batch`` over what the device held before each (the first not read)."""
    peaks = StepPeaks(resettable_counter(DEVICES.accelerator), skip=1)
    model.fit(*images(4 * batch), batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[peaks])
    return max(peaks.step_bytes)


def test_lms_holds_each_kernels_scratch_at_its_op_as_its_first_step_measured_it(accelerator_memory):
    accelerator_memory("256MiB")
    model = float64_cnn()
    lms = LMS(verbose=0)
    model.fit(*images(3 * BATCH), batch_size=BATCH, epochs=1, verbose=0, callbacks=[lms])
    peak = lms.stats.peak_without_lms
    scratch = [row for row in peak["top"] if row["kind"] == "kernel_scratch"]
    assert peak["by_kind"]["kernel_scratch"] >= 2**20 and scratch and scratch[0]["layer"].startswith("conv2d"), peak
    assert "kernels' scratch as measured" in " ".join(lms.stats.notes)
    assert lms.stats.without_lms_measured  # nothing moved: the figure without LMS is its first step, measured
    figure = peak["bytes"] - lms.stats.persistent_bytes  # the replay's, with each kernel's scratch
    measured = measured_step_bytes(model, BATCH)
    assert 0.9 <= figure / measured <= 1.1, (figure, measured)
    assert peak["by_kind"]["kernel_scratch"] > figure / 2  # without it, the figure would be less than half


def test_explain_fit_names_the_kernels_scratch_and_holds_it_at_other_batches(accelerator_memory):
    accelerator_memory("256MiB")
    found = explain_fit(float64_cnn(), images(64), batch_size=BATCH, modes=("without LMS",), batch_sizes=(2, 16),
                        min_bytes=0)
    scratch = found.peak["by_kind"]["kernel_scratch"]
    assert scratch >= 2**20 and "kernel scratch" in str(found) and "conv2d" in found.correction.scratch
    # the buffers sized by the caches: at a batch a quarter the size, the figure still holds them
    assert found.frontier[0].peak_bytes >= scratch > found.frontier[1].peak_bytes - found.frontier[0].peak_bytes


def test_a_profiler_the_user_runs_is_left_running_and_lms_trains_without_the_scratch(devices, tmp_path):
    model = float64_cnn()
    tf.profiler.experimental.start(str(tmp_path))
    try:
        lms = LMS(verbose=0, device=devices.accelerator, host_device=devices.host)
        model.fit(*images(2 * BATCH), batch_size=BATCH, epochs=1, verbose=0, callbacks=[lms])
    finally:
        tf.profiler.experimental.stop()  # raises where LMS stopped the user's session
    assert list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))
    assert lms.stats.active and lms.stats.peak_without_lms["by_kind"]["kernel_scratch"] == 0


def test_a_first_calls_profile_holds_its_run_not_the_building_of_its_graphs(accelerator_memory):
    """A function's first call builds its graphs before it runs them, and Grappler's constant folding allocates
    on the same allocator: none of that is the step LMS measures (its scratch, what the device held)."""
    from lms_magic.lms.tensorflow.executed import step_profile_recorded

    accelerator_memory("256MiB")

    @tf.function
    def step(x):
        folded = tf.reduce_sum(tf.ones([1024, 1024, 2]) * 3.0)  # 8 MiB, computed while the graph is optimized
        return x * folded

    profiles = []
    with tf.device(DEVICES.accelerator):
        x = tf.ones([4])
        with step_profile_recorded(profiles.append, DEVICES.accelerator):
            result = step(x)
    assert float(result[0]) == 3.0 * 2**21
    assert profiles and profiles[0].events, "the run's own allocations were read"
    assert max(event.nbytes for event in profiles[0].events) < 2**20, [
        (event.op, event.nbytes) for event in profiles[0].events if event.nbytes >= 2**20]
