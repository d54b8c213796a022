"""The LMS train function trains with LMS only in the fit that armed it."""

import contextlib
import types

from lms_magic.lms.train_function import LmsTrainFunction


def test_a_later_fit_is_never_taken_for_the_fit_that_armed_the_function():
    """A fit that ends between LMS's batch begin and its step leaves the function armed; a later
    plain fit's frames can take the dead fit's addresses (case 47 of the seeded fault run once did)."""
    calls = []
    model = types.SimpleNamespace(train_function=None)
    function = LmsTrainFunction(lambda: calls.append("lms"), lambda: calls.append("plain"), model,
                                contextlib.nullcontext)

    def fit(with_lms, interrupted=False):  # as Keras's fit: the callbacks' batch begin, then the train function
        def on_train_batch_begin():
            if with_lms:
                function.arm()

        on_train_batch_begin()
        if interrupted:
            raise KeyboardInterrupt
        model.train_function()

    fit(with_lms=True)
    assert calls == ["lms"] and model.train_function is function.plain
    for _ in range(200):
        try:
            fit(with_lms=True, interrupted=True)
        except KeyboardInterrupt:
            pass  # the dead fit's frames are freed here
        assert model.train_function is function and LmsTrainFunction.is_in(model)
        fit(with_lms=False)  # a plain fit: the same code, so its frames may take the dead ones' addresses
    assert calls == ["lms"] + ["plain"] * 200
    LmsTrainFunction.remove_from(model)
    assert model.train_function is function.plain and not LmsTrainFunction.is_in(model)
