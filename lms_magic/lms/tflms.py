"""TFLMS's ``LMSKerasCallback``, for scripts written for IBM's TensorFlow 1 LMS."""

from __future__ import annotations

from .callback import LMS


class LMSKerasCallback(LMS):
    """TFLMS's ``LMSKerasCallback`` names, mapped onto :class:`LMS`.

    Accepts ``n_tensors``, ``lb``, ``starting_scope``/``starting_op_names``/``ub``
    (ignored, with a note in ``stats["notes"]``), ``excl_scopes``/``incl_scopes`` (layer names),
    ``excl_types``/``incl_types``, and ``cpu_device`` (the host device).

    Example:
        >>> LMSKerasCallback(n_tensors=4, lb=3, cpu_device="/cpu:0").lb
        3
    """

    def __init__(self, n_tensors=-1, lb=1, starting_scope=None, starting_op_names=None, excl_scopes=(),
                 incl_scopes=(), excl_types=(), incl_types=(), cpu_device="/CPU:0", ub=None, **options):
        super().__init__(n_tensors=n_tensors, lb=lb, include_layers=tuple(incl_scopes),
                         exclude_layers=tuple(excl_scopes), include_types=tuple(incl_types),
                         exclude_types=tuple(excl_types), host_device=cpu_device, **options)
        given = {"starting_scope": starting_scope, "starting_op_names": starting_op_names, "ub": ub}
        self.ignored = sorted(name for name, value in given.items() if value is not None)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self.ignored:
            self.stats["notes"].append(f"ignored TFLMS option(s) {', '.join(self.ignored)}: candidates are found "
                                       "from the gradient computation, in forward order")
