"""%lms_tune through a real InteractiveShell: bad input refused before anything runs, --autotune, help,
and what it prints where there is no widget (ipython/lms_tune.py)."""

import numpy as np
import pytest

from tests.conftest import DEVICES
from tests.models import reference_cnn_small

ACCELERATOR, HOST = DEVICES.accelerator, DEVICES.host


@pytest.mark.parametrize("line, message", [
    ("model --batch-size 16", "no data"),
    ("model --data (x, y) --batch-size 0", "--batch-size 0: must be a whole number >= 1"),
    ("plain --data (x, y)", "not compiled"),
    ("model --data (x, y) --budget 1KiB", "below the model's weights"),
    ("model --data (x, y) --budget lots", "not a memory size"),
    ("3 --data (x, y)", "'3' is 'int', not a Keras model"),
    ("model --data (x, y) --bogus 3", "unknown option '--bogus'"),
    ("model --bogus 3 --data (x, y)", "unknown option '--bogus'"),
    ("model --data (x, y) --device /GPU:7", "--device /GPU:7: is not a device of this process, which has /CPU:0"),
    ("model --data (x, z)", "could not evaluate --data ('(x, z)'): NameError"),
    ("model --data (x, y) --batch-size sixteen", "invalid int value: 'sixteen'"),
    ("--data (x, y)", "no model"),
])
def test_bad_input_gets_a_clear_error_and_nothing_runs(shell, tuning_data, line, message):
    import keras
    from IPython.core.error import UsageError

    model = reference_cnn_small()
    before = [v.numpy() for v in model.variables]
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    shell.user_ns.update(model=model, plain=plain, x=tuning_data[0], y=tuning_data[1])
    with pytest.raises(UsageError) as raised:
        shell.run_line_magic("lms_tune", line)
    assert message in str(raised.value)
    assert not shell.run_cell(f"%lms_tune {line}").success  # the cell fails, as with %timeit's errors
    assert model.train_function is None  # nothing trained
    for old, variable in zip(before, model.variables):
        np.testing.assert_array_equal(old, variable.numpy())
    assert int(model.optimizer.iterations.numpy()) == 0


def test_autotune_from_the_magic_returns_the_search(shell, tuning_data, capsys):
    shell.user_ns.update(model=reference_cnn_small(), x=tuning_data[0], y=tuning_data[1])
    found = shell.run_line_magic("lms_tune", f"model --data (x, y) --batch-size 16 --steps 2 --max-trials 2 "
                                 f"--min-bytes 0 --device {ACCELERATOR} --host-device {HOST} --autotune")
    assert found.measured_trials == 2 and "autotune: 2 measured trial(s)" in capsys.readouterr().out


def test_lms_tune_help_lists_every_option():
    """`%lms_tune?` shows the docstring, which magic_arguments completes with the options."""
    from lms_magic.ipython.lms_tune import LmsTuneMagics

    help_text = LmsTuneMagics.lms_tune.__doc__
    for option in ("--data", "--batch-size", "--budget", "--steps", "--max-trials", "--min-bytes", "--device",
                   "--host-device", "--autotune"):
        assert option in help_text


def test_in_a_terminal_lms_tune_prints_the_plan_and_what_fills_the_peak(shell, tuning_data, capsys):
    shell.user_ns.update(model=reference_cnn_small(), x=tuning_data[0], y=tuning_data[1])
    assert shell.run_line_magic("lms_tune", f"model --data (x, y) --batch-size 16 --min-bytes 0 "
                                            f"--device {ACCELERATOR} --host-device {HOST}") is None
    out = capsys.readouterr().out
    assert "the sliders need a notebook" in out
    without, planned = [line for line in out.splitlines() if line.startswith("  with")]
    assert without.startswith("  without LMS: peak ") and planned.startswith("  with the plan: peak ")
    assert "activations_kept" in without and " pass (after " in planned
