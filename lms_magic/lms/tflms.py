"""TFLMS's ``LMSKerasCallback``, for scripts written for IBM's TensorFlow 1 LMS."""

from __future__ import annotations

from .callback import LMS
from .options import device_name


class LMSKerasCallback(LMS):
    """TFLMS's ``LMSKerasCallback`` names, mapped onto :class:`LMS`.

    Accepts ``n_tensors``, ``lb``, ``starting_scope``/``starting_op_names``/``ub``
    (ignored, with a note in ``stats["notes"]``), ``excl_scopes``/``incl_scopes`` (layer names),
    ``excl_types``/``incl_types``, and ``cpu_device`` (the host device), and
    every :class:`LMS` argument by its own name (``host_device``, ``include_layers``...).
    A TFLMS name and its :class:`LMS` name given with different values is an error.

    Example:
        >>> LMSKerasCallback(n_tensors=4, lb=3, cpu_device="/cpu:0").lb
        3
        >>> LMSKerasCallback(host_device="/CPU:0", cpu_device="/cpu:0").host_device
        '/CPU:0'
    """

    def __init__(self, n_tensors=-1, lb=1, starting_scope=None, starting_op_names=None, excl_scopes=None,
                 incl_scopes=None, excl_types=None, incl_types=None, cpu_device=None, ub=None, **options):
        pairs = {"host_device": ("cpu_device", cpu_device), "include_layers": ("incl_scopes", incl_scopes),
                 "exclude_layers": ("excl_scopes", excl_scopes), "include_types": ("incl_types", incl_types),
                 "exclude_types": ("excl_types", excl_types)}
        for name, (tflms_name, value) in pairs.items():
            if value is None:
                continue
            if name in options and _normal(name, options[name]) != _normal(name, value):
                raise ValueError(f"LMSKerasCallback: {tflms_name}={value!r} and {name}={options[name]!r} say "
                                 f"different things; give one of them ({tflms_name} is TFLMS's name for {name})")
            options.setdefault(name, value)
        super().__init__(n_tensors=n_tensors, lb=lb, **options)
        given = {"starting_scope": starting_scope, "starting_op_names": starting_op_names, "ub": ub}
        self.ignored = sorted(name for name, value in given.items() if value is not None)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self.ignored:
            self.stats.notes.append(f"ignored TFLMS option(s) {', '.join(self.ignored)}: candidates are found "
                                       "from the gradient computation, in forward order")


def _normal(name: str, value):
    """A device or a name list, spelled one way: "/cpu:0" is "/device:CPU:0", "a" is ("a",)."""
    if name == "host_device":
        return device_name(str(value))
    return (value,) if isinstance(value, str) else tuple(value)
