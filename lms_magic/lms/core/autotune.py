"""Autotune's search over LMS settings (pure Python: no framework).

The search starts where the prediction says (the fewest swaps whose
predicted peak fits the budget, as TFLMS v2's simulator chose) and then
*measures*: it tries the neighbours of the best setting so far (more or
fewer tensors, a larger or smaller ``lb``), moves to a faster one, and
halves the ``n_tensors`` step when no neighbour is faster, until the step is
one value and still no neighbour wins (a pattern search). Settings that the
prediction already puts over the budget are skipped without running; a trial
that runs out of memory is marked and skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence
from ...units import MIB


@dataclass(frozen=True)
class Setting:
    """One choice of the LMS knobs.

    Args:
        n_tensors: how many candidate tensors to swap, first produced first.
        lb: how far ahead of its consumer a swap-in starts.
        batch_size: the training batch size.
    """

    n_tensors: int
    lb: int = 1
    batch_size: int = 32

    def lms_call(self, **options) -> str:
        """The equivalent ``LMS(...)`` call, to paste into a script.

        Example:
            >>> Setting(12, 2, 64).lms_call(min_bytes=0)
            'LMS(n_tensors=12, lb=2, min_bytes=0)  # with batch_size=64'
        """
        extra = "".join(f", {name}={value!r}" for name, value in options.items() if value is not None)
        return f"LMS(n_tensors={self.n_tensors}, lb={self.lb}{extra})  # with batch_size={self.batch_size}"


@dataclass
class Trial:
    """One setting, measured (or skipped).

    ``status`` is "ok", "oom" (ran out of memory), "over budget" (measured
    peak above the budget), "predicted over budget" (not run) or "error".
    """

    setting: Setting
    status: str
    step_s: float | None = None
    peak_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    message: str = ""

    @property
    def measured(self) -> bool:
        return self.status != "predicted over budget"

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.step_s is not None

    def row(self) -> dict:
        """The trial as a table row (times in ms, memory in MiB)."""
        return {"n_tensors": self.setting.n_tensors, "lb": self.setting.lb, "batch_size": self.setting.batch_size,
                "status": self.status, "ms_per_step": None if self.step_s is None else round(self.step_s * 1e3, 3),
                "peak_mib": None if self.peak_bytes is None else round(self.peak_bytes / MIB, 1),
                "predicted_peak_mib": None if self.predicted_peak_bytes is None
                else round(self.predicted_peak_bytes / MIB, 1), "message": self.message}


def best_trial(trials: Sequence[Trial]) -> Trial | None:
    """The fastest trial that ran and fit (ties: fewer tensors swapped)."""
    fitting = [t for t in trials if t.ok]
    return min(fitting, key=lambda t: (t.step_s, t.setting.n_tensors)) if fitting else None


@dataclass
class SearchResult:
    """What a search found: the best trial (None if nothing fit) and every trial in order."""

    best: Trial | None
    trials: list[Trial]
    stopped_by: str  # "converged", "max_trials", "user", "nothing fits"

    @property
    def measured_trials(self) -> int:
        return sum(t.measured for t in self.trials)

    def __str__(self) -> str:
        lines = [f"autotune: {self.measured_trials} measured trial(s), stopped: {self.stopped_by}"]
        for trial in self.trials:
            row = trial.row()
            lines.append(f"  n_tensors={row['n_tensors']:>4} lb={row['lb']} batch={row['batch_size']}: "
                         f"{row['status']}" + (f", {row['ms_per_step']} ms/step" if row['ms_per_step'] else "")
                         + (f", peak {row['peak_mib']} MiB" if row['peak_mib'] is not None else ""))
        lines.append("best: " + (self.best.setting.lms_call() if self.best else "none fits"))
        return "\n".join(lines)


def default_n_values(n_candidates: int, start: int, points: int = 16) -> list[int]:
    """Counts to try: 0, all, the start, and ``points`` evenly spaced counts between.

    Example:
        >>> default_n_values(10, 3, points=4)
        [0, 2, 3, 5, 8, 10]
    """
    values = {0, n_candidates, min(max(start, 0), n_candidates)}
    values |= {round(n_candidates * k / points) for k in range(1, points)}
    return sorted(values)


def pattern_search(start: Setting, measure: Callable[[Setting], Trial], n_values: Sequence[int],
                   lb_values: Sequence[int], max_trials: int, budget_bytes: int | None = None,
                   predicted_peak: Callable[[Setting], int] | None = None,
                   should_stop: Callable[[], bool] = lambda: False,
                   on_trial: Callable[[Trial], None] = lambda trial: None) -> SearchResult:
    """Measures settings around ``start`` until no neighbour is faster.

    Args:
        start: the first setting (its n_tensors and lb should be in the values).
        measure: runs a trial; returns a :class:`Trial` (never raises for OOM).
        n_values, lb_values: the values each knob may take.
        max_trials: the most trials to run (skipped ones do not count).
        budget_bytes: a trial whose peak is above it does not fit.
        predicted_peak: the predicted peak of a setting, to skip hopeless ones.
        should_stop: polled before each trial (the widget's Stop button).
        on_trial: called with each trial as it finishes.

    Example:
        >>> cost = lambda s: 1.0 + abs(s.n_tensors - 6) / 10 + (s.lb - 2) ** 2 / 10
        >>> run = lambda s: Trial(s, "ok", step_s=cost(s))
        >>> found = pattern_search(Setting(0, 1), run, list(range(11)), [1, 2, 3], max_trials=30)
        >>> found.best.setting, found.stopped_by
        (Setting(n_tensors=6, lb=2, batch_size=32), 'converged')
    """
    return drive(PatternSearch(start, n_values, lb_values, max_trials, budget_bytes, predicted_peak), measure,
                 should_stop, on_trial)


def drive(search: "PatternSearch", measure: Callable[[Setting], Trial],
          should_stop: Callable[[], bool] = lambda: False,
          on_trial: Callable[[Trial], None] = lambda trial: None) -> SearchResult:
    """Runs ``search`` to its end: measure each setting it hands out, poll ``should_stop`` before each."""
    setting = search.next_setting()
    while setting is not None:
        if should_stop():
            search.stop("user")
            break
        trial = search.record(measure(setting))
        on_trial(trial)
        setting = search.next_setting()
    return search.result()


class PatternSearch:
    """The search as a state machine: ask :meth:`next_setting`, measure it, :meth:`record` the trial.

    Driven by :func:`pattern_search` (a loop) or by the widget (one trial per
    turn of the event loop, so its Stop button is heard between trials).
    Settings predicted over the budget are recorded as skipped without being
    handed out.
    """

    def __init__(self, start: Setting, n_values: Sequence[int], lb_values: Sequence[int], max_trials: int,
                 budget_bytes: int | None = None, predicted_peak: Callable[[Setting], int] | None = None):
        if max_trials < 1:
            raise ValueError(f"max_trials must be at least 1, got {max_trials}")
        self.n_values, self.lb_values = sorted(set(n_values)), sorted(set(lb_values))
        self.batch_size, self.max_trials = start.batch_size, max_trials
        self.budget_bytes, self.predicted_peak = budget_bytes, predicted_peak
        self.trials: list[Trial] = []
        self.stopped_by: str | None = None
        self._tried: dict[tuple[int, int], Trial] = {}
        self._at = (_index_of(self.n_values, start.n_tensors), _index_of(self.lb_values, start.lb))
        self._step = max(1, len(self.n_values) // 4)
        self._phase = "start"  # "start": find a setting that fits; "climb": try neighbours
        self._pending: tuple[int, int] | None = None
        self._queue: list[tuple[int, int]] = []

    def _setting(self, key: tuple[int, int]) -> Setting:
        return Setting(self.n_values[key[0]], self.lb_values[key[1]], self.batch_size)

    def _neighbours(self) -> list[tuple[int, int]]:
        i, j = self._at
        keys = [(i + self._step, j), (i - self._step, j)]
        if self.n_values[i] != 0:  # with nothing swapped, lb changes nothing
            keys += [(i, j + 1), (i, j - 1)]
        return [(a, b) for a, b in keys if 0 <= a < len(self.n_values) and 0 <= b < len(self.lb_values)]

    def stop(self, reason: str) -> None:
        self.stopped_by = self.stopped_by or reason

    def next_setting(self) -> Setting | None:
        """The next setting to measure, or None when the search is over."""
        while self.stopped_by is None:
            key = self._next_key()
            if key is None:
                return None
            if key in self._tried:
                self._advance(key, self._tried[key])
                continue
            setting = self._setting(key)
            predicted = self.predicted_peak(setting) if self.predicted_peak else None
            if self.budget_bytes is not None and predicted is not None and predicted > self.budget_bytes:
                skipped = Trial(setting, "predicted over budget", predicted_peak_bytes=predicted,
                                message="not run: the prediction is above the budget")
                self._tried[key] = skipped
                self.trials.append(skipped)
                self._advance(key, skipped)
                continue
            if sum(t.measured for t in self.trials) >= self.max_trials:
                self.stop("max_trials")
                return None
            self._pending = key
            return setting
        return None

    def record(self, trial: Trial) -> Trial:
        """Takes the measured trial of the setting last handed out."""
        key, self._pending = self._pending, None
        _judge(trial, self.budget_bytes)
        self._tried[key] = trial
        self.trials.append(trial)
        self._advance(key, trial)
        return trial

    def _next_key(self) -> tuple[int, int] | None:
        if self._phase == "start":
            return self._at
        if not self._queue:
            if self._step == 1:
                self.stop("converged")
                return None
            self._step //= 2
            self._queue = self._neighbours()
        return self._queue[0] if self._queue else self._next_key()

    def _advance(self, key: tuple[int, int], trial: Trial) -> None:
        if self._phase == "start":
            if trial.ok:
                self._phase, self._queue = "climb", self._neighbours()
            elif self._at[0] < len(self.n_values) - 1:  # out of memory or over budget: swap more
                self._at = (min(self._at[0] + self._step, len(self.n_values) - 1), self._at[1])
            else:
                self.stop("nothing fits")
            return
        self._queue.remove(key)
        if trial.ok and trial.step_s < self._tried[self._at].step_s:
            self._at = key
            self._queue = self._neighbours()

    def result(self) -> SearchResult:
        return SearchResult(best_trial(self.trials), list(self.trials), self.stopped_by or "converged")


def _index_of(values: Sequence[int], value: int) -> int:
    """The position of the value in ``values`` nearest to ``value``."""
    return min(range(len(values)), key=lambda k: (abs(values[k] - value), k))


def grid_search(settings: Sequence[Setting], measure: Callable[[Setting], Trial],
                budget_bytes: int | None = None) -> SearchResult:
    """Measures every setting: the reference autotune is judged against."""
    trials = [_judge(measure(setting), budget_bytes) for setting in settings]
    return SearchResult(best_trial(trials), trials, "converged")


def _judge(trial: Trial, budget_bytes: int | None) -> Trial:
    """Marks a trial that ran but whose measured peak is above the budget."""
    if trial.ok and budget_bytes is not None and trial.peak_bytes is not None and trial.peak_bytes > budget_bytes:
        trial.status, trial.message = "over budget", "the measured peak is above the budget"
    return trial
