"""The contracts between the ``LMS`` callback and one framework (pure: no framework import): ``Framework``,
what LMS asks of it around a fit, and ``Backend``, the engine of one fit.

A backend does the work of one ``fit``: it is made when training begins (with the model, the
checked :class:`~lms_magic.lms.options.LmsOptions` and the fit's :class:`~lms_magic.lms.core.stats.LmsStats`),
wraps the model's train step, is entered around every LMS step, hears once that the first step
ran (then fills in the stats: what moved, the peaks), says its one-line summary, and is closed
when the fit ends, however it ends. ``TensorFlowBackend`` (``tensorflow/backend.py``),
``TorchBackend`` (``torch/backend.py``) and ``JaxBackend`` (``jax/backend.py``) implement it;
``lms_magic/testing/backends.py`` has a scripted one for tests.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, ContextManager, Protocol

from .core.prediction import StepPredictor
from .core.stats import LmsStats
from .options import LmsOptions


class Action(enum.Enum):
    """What the callback does after a backend has seen a step it checked."""

    KEEP = "keep"  # the plan stands
    RETRACE = "retrace"  # the backend changed its plan: the train function is made again (the next step traces it)
    STEP_OUT = "step out"  # nothing moves: the model trains with its own train function from the next step


class Backend(Protocol):
    """One fit's LMS on one framework."""

    jit_note: str  # said when the user compiled with XLA / torch.compile, which LMS turns off while it trains

    def train_step(self, original: Callable) -> Callable:
        """The model's train step ``original``, wrapped to move what the plan moves."""

    def step_scope(self) -> ContextManager[None]:
        """What one LMS step needs set, and nothing after it."""

    # Optional: ``train_function(function) -> function``, the train function made with the wrapped step as the
    # callback will call it (JAX's commits the state to the device first); the callback calls ``function``
    # itself where a backend has none.
    # Optional: ``batch_shapes``, the batch's ``(shape, dtype)`` leaves as its step saw them (``samples.batch_shapes``),
    # on which the callback explains an out-of-memory error of an LMS step; None or absent: a shorter message.

    def first_step_done(self, measured_step_bytes: int | None = None) -> Action:
        """After the first LMS step (and after the first step of a retrace): fills in the stats (what moved,
        the device peaks) and says what the callback does next. ``measured_step_bytes``: the step's peak over what
        the device held before it, from the device's allocator where the callback read it (a GPU's; TensorFlow
        plans again where it held more than the plan was allowed; the others' peaks are their own already)."""

    def summary_line(self) -> str:
        """One line for the user: what moves, and the peaks."""

    def close(self) -> None:
        """Releases what the fit held (streams, pinned buffers); called once, however the fit ended."""


BackendFactory = Callable[[Any, LmsOptions, LmsStats], Backend]


class Framework:
    """What LMS asks of one framework before and around a fit: its devices, the device LMS relieves and its
    capacity, why LMS stays off, which options it does not honour (and why), the backend that does one fit's
    work, the tuner's predictor and where trials train. Each framework subclasses it once
    (``<framework>/framework.py``); every member is a class attribute or a static / class method: no instance
    is made. ``lms/framework.py``'s ``framework()`` chooses one."""

    name: str = ""  # Keras's name for the backend: "tensorflow", "torch", "jax"
    version_modules: tuple[str, ...] = ()  # the framework modules whose versions LMS checks, besides Keras
    tuner_refusal: str | None = None  # why %lms_tune does not run on this framework, or None where it does
    predictor_unavailable: dict[str, str] = {}  # option -> why the predictor (explain_fit) does not predict it
    trials_measure_peak = False  # whether a measured trial on a GPU reads the allocator's peak (else the prediction)
    # whether LMS plans for the device's budget as the steps measured on it correct the replay (core.device_model):
    # then explain_fit's %%lms_fit line needs no budget in the replay's bytes
    plans_by_device_model = False
    # whether LMS keeps its first step's swaps of every eligible tensor (a probe) instead of tracing its plan where
    # their copies cost no more than the plan's by the step-time model: then that step is what its fit holds
    keeps_free_probe = False
    unavailable: dict[str, str] = {}  # option -> why it is not honoured (noted in the stats, refused by the tuner)

    @staticmethod
    def process() -> tuple[int, int]:
        """This process's index among the processes that train together, and how many there are ((0, 1) alone):
        process 0 prints, every process keeps its stats."""
        return 0, 1

    @staticmethod
    def devices() -> list[str]:
        """The devices of this process, spelt as LMS spells them ("/CPU:0", "/GPU:0")."""
        raise NotImplementedError

    @classmethod
    def prepare(cls, options: LmsOptions, stats: LmsStats, model=None) -> LmsOptions:
        """The options with the devices checked and filled in; the device's capacity in ``stats``, and the
        devices relieved (``stats.devices``) where ``model`` trains on several."""
        raise NotImplementedError

    @staticmethod
    def off_reason(options: LmsOptions, model=None) -> tuple[str, str] | None:
        """Why LMS stays off with these (prepared) options (the stats' reason, and the notice for the user), or
        None (the default: it runs)."""
        return None

    @staticmethod
    def backend() -> Any:
        """The class that does one fit's work (a ``Backend``)."""
        raise NotImplementedError

    @classmethod
    def predictor(cls, model, samples, options: LmsOptions, lean_ops: bool, order_backward: bool,
                  recompute) -> StepPredictor:
        """The predictor (the tuner's, ``explain_fit``'s) for ``options``; by default a ValueError saying why the
        tuner does not run here."""
        raise ValueError(cls.tuner_refusal or f"the tuner does not run on {cls.name!r}")

    @staticmethod
    def wait_for_the_device(model) -> None:
        """Waits for the steps ``fit`` has handed the device to finish, so that an error of theirs (out of
        memory) is raised here. By default nothing: the framework's ``fit`` returns when its steps have run."""

    @staticmethod
    def trial_device() -> tuple[str | None, bool]:
        """The device measured trials train on (None: the framework's own choice), and whether it is a GPU."""
        raise NotImplementedError

    @staticmethod
    def kernel_scratch_recorded(recorded: Callable[[dict[str, int]], None], device: str | None = None
                                ) -> ContextManager[None]:
        """A block (one measured train step on ``device``) whose kernels' scratch is read off the allocator's
        events: ``recorded`` gets each op's (``core.scratch.kernel_scratch``, ops named as in the train step), where
        the framework can say. By default none is read (the block runs, ``recorded`` is not called)."""
        import contextlib

        return contextlib.nullcontext()

    @staticmethod
    def trial_peak_source(gpu: bool) -> str:
        """Where a trial's device peak comes from (measured or predicted, and how)."""
        raise NotImplementedError
