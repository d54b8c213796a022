"""LMS options: every value checked once, with a message that says what the option takes."""

import keras
import pytest

from lms_magic import LMS
from lms_magic.lms.options import LmsOptions, OptionError, device_name


@pytest.mark.parametrize("options, words", [
    ({"lb": 0}, "lb=0: must be a whole number >= 1"),
    ({"lb": 1.5}, "lb=1.5: must be a whole number >= 1"),
    ({"n_tensors": -3}, r"n_tensors=-3: must be None \(planned.*-1 \(all\), 0 \(LMS off\)"),
    ({"n_tensors": True}, "n_tensors=True: must be None"),
    ({"n_tensors": "all"}, "n_tensors='all': must be None"),
    ({"min_bytes": -1}, "min_bytes=-1: must be a whole number >= 0"),
    ({"budget": "lots"}, "budget='lots': not a memory size"),
    ({"budget": 0}, "budget=0: not a memory size: give a positive number"),
    ({"device": 0}, "device=0: takes a device name such as '/GPU:0'"),
    ({"include_layers": 3}, "include_layers=3: takes a layer name or a list of them"),
    ({"exclude_types": ["Dense", 7]}, r"exclude_types=\['Dense', 7\]: takes names \(strings\) or layer classes, not 7"),
    ({"batch_size_hint": 0}, "batch_size_hint=0: must be a whole number >= 1"),
    ({"order_backward": "yes"}, r"order_backward='yes': takes True \(the backward pass one layer's gradient"),
])
def test_a_bad_value_is_refused_when_the_callback_is_made(options, words):
    with pytest.raises(OptionError, match=words) as raised:
        LMS(verbose=0, **options)
    assert isinstance(raised.value, ValueError)  # what API users catch


def test_the_magics_say_it_with_the_flag_as_typed():
    with pytest.raises(OptionError) as raised:
        LmsOptions(budget_bytes="lots")
    assert raised.value.for_magic().startswith("--budget lots: not a memory size")
    with pytest.raises(OptionError) as raised:
        LmsOptions(host_device=3)
    assert raised.value.for_magic().startswith("--host-device 3: takes a device name")


@pytest.mark.parametrize("spelt, spelling", [("cuda:1", "/GPU:1"), ("/device:GPU:0", "/GPU:0"), ("gpu", "/GPU:0"),
                                              ("/cpu:1", "/CPU:1"), ("CPU", "/CPU:0"),
                                              ("/job:localhost/replica:0/task:0/device:GPU:2", "/GPU:2")])
def test_devices_are_spelt_one_way(spelt, spelling):
    assert device_name(spelt) == spelling
    assert LMS(device=spelt, host_device=spelt, verbose=0).options.host_device == spelling


def test_one_name_as_a_string_is_one_name_not_its_letters():
    assert LmsOptions(include_layers="conv_1").selection == LmsOptions(include_layers=["conv_1"]).selection
    assert LmsOptions(include_types=keras.layers.Dense).include_types == ("Dense",)


def test_budget_takes_bytes_or_a_size_and_the_hint_a_function():
    assert LmsOptions(budget_bytes="1.5 KiB").budget_bytes == 1536 == LmsOptions(budget_bytes=1536).budget_bytes
    assert LmsOptions(batch_size_hint=lambda: 24).batch_size() == 24
    with pytest.raises(OptionError, match="batch_size_hint=0"):
        LmsOptions(batch_size_hint=lambda: 0).batch_size()
