"""Autotune's search on cost landscapes whose answer is known (pure: no training)."""

import itertools

import pytest

from lms_magic.lms.core.autotune import PatternSearch, Setting, Trial, default_n_values, grid_search, pattern_search

N_VALUES = list(range(0, 33, 2))
LB_VALUES = [1, 2, 3, 4]
MIB = 2**20


def landscape(best_n, best_lb, oom_below=None, noise=0.0):
    """Time per step grows away from (best_n, best_lb); fewer than ``oom_below`` tensors run out of memory."""
    calls = []

    def measure(setting):
        calls.append(setting)
        if oom_below is not None and setting.n_tensors < oom_below:
            return Trial(setting, "oom", message="out of memory")
        step_s = 0.1 + 0.002 * abs(setting.n_tensors - best_n) + 0.01 * abs(setting.lb - best_lb)
        step_s *= 1 + noise * ((hash((setting.n_tensors, setting.lb)) % 7) - 3) / 3
        return Trial(setting, "ok", step_s=step_s, peak_bytes=(100 - setting.n_tensors) * MIB)

    return measure, calls


def grid_best(measure):
    settings = [Setting(n, lb) for n, lb in itertools.product(N_VALUES, LB_VALUES)]
    return grid_search(settings, measure).best


@pytest.mark.parametrize("best_n, best_lb, start_n", [(10, 2, 0), (30, 4, 16), (0, 1, 32), (18, 3, 6)])
def test_finds_the_grid_best_in_fewer_trials(best_n, best_lb, start_n):
    measure, calls = landscape(best_n, best_lb)
    found = pattern_search(Setting(start_n, 1), measure, N_VALUES, LB_VALUES, max_trials=40)
    reference = grid_best(landscape(best_n, best_lb)[0])
    assert found.best.step_s <= 1.1 * reference.step_s
    assert found.measured_trials < len(N_VALUES) * len(LB_VALUES)
    assert len(set(calls)) == len(calls), "a setting was measured twice"
    assert found.stopped_by == "converged"


def test_with_noise_stays_within_ten_percent_of_the_grid():
    measure, _ = landscape(20, 2, noise=0.03)
    found = pattern_search(Setting(0, 1), measure, N_VALUES, LB_VALUES, max_trials=40)
    assert found.best.step_s <= 1.1 * grid_best(landscape(20, 2, noise=0.03)[0]).step_s


def test_out_of_memory_trials_are_marked_and_skipped():
    measure, _ = landscape(8, 1, oom_below=12)
    found = pattern_search(Setting(0, 1), measure, N_VALUES, LB_VALUES, max_trials=40)
    assert found.trials[0].status == "oom"
    assert found.best.setting.n_tensors >= 12
    assert all(t.status in ("ok", "oom") for t in found.trials)


def test_nothing_fits_says_so():
    measure, _ = landscape(8, 1, oom_below=100)
    found = pattern_search(Setting(0, 1), measure, N_VALUES, LB_VALUES, max_trials=40)
    assert found.best is None and found.stopped_by == "nothing fits"


def test_budget_skips_settings_predicted_over_it_without_running_them():
    measure, calls = landscape(0, 1)
    predicted = lambda s: (100 - s.n_tensors) * MIB  # noqa: E731
    found = pattern_search(Setting(20, 1), measure, N_VALUES, LB_VALUES, max_trials=40,
                           budget_bytes=80 * MIB, predicted_peak=predicted)
    assert all(s.n_tensors >= 20 for s in calls)
    assert found.best.setting.n_tensors == 20
    skipped = [t for t in found.trials if t.status == "predicted over budget"]
    assert skipped and not any(t.setting in calls for t in skipped)


def test_measured_peak_over_budget_does_not_count_as_fitting():
    measure, _ = landscape(0, 1)
    found = pattern_search(Setting(10, 1), measure, N_VALUES, LB_VALUES, max_trials=40, budget_bytes=85 * MIB)
    assert all(t.peak_bytes <= 85 * MIB for t in found.trials if t.ok)
    assert found.best.setting.n_tensors == 16  # the fastest that fits: closest to 0 with peak <= 85 MiB


def test_max_trials_and_stop_end_the_search():
    measure, calls = landscape(30, 4)
    assert pattern_search(Setting(0, 1), measure, N_VALUES, LB_VALUES, max_trials=3).stopped_by == "max_trials"
    assert len(calls) == 3
    polls = iter([False, False, True])
    found = pattern_search(Setting(0, 1), landscape(30, 4)[0], N_VALUES, LB_VALUES, max_trials=40,
                           should_stop=lambda: next(polls))
    assert found.stopped_by == "user" and found.measured_trials == 2


def test_no_lb_trials_when_nothing_is_swapped():
    measure, calls = landscape(0, 1)
    pattern_search(Setting(0, 1), measure, N_VALUES, LB_VALUES, max_trials=40)
    assert not any(s.n_tensors == 0 and s.lb != 1 for s in calls)


def test_driven_step_by_step_like_the_widget():
    measure, _ = landscape(10, 2)
    search = PatternSearch(Setting(0, 1), N_VALUES, LB_VALUES, max_trials=40)
    while (setting := search.next_setting()) is not None:
        search.record(measure(setting))
    assert search.result().best.setting == Setting(10, 2)


def test_bad_max_trials_is_refused():
    with pytest.raises(ValueError, match="max_trials"):
        pattern_search(Setting(0, 1), landscape(0, 1)[0], N_VALUES, LB_VALUES, max_trials=0)


def test_default_values_span_none_to_all():
    values = default_n_values(319, 57)
    assert values[0] == 0 and values[-1] == 319 and 57 in values and len(values) <= 19
