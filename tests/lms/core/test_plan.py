"""The planning rule (pure): which candidates to swap, by count, filters, budget or lowest peak."""

import random

import pytest

from lms_magic.lms.core.plan import (CAPACITY_HEADROOM, BudgetError, Candidate, Rule, Selection, _PrefixPeaks,
                                     fewest_swaps_within, lowest_peak_plan, plan_swaps)
from lms_magic.units import parse_bytes


def cand(i, nbytes=100, layer="conv", layer_type="Conv2D"):
    return Candidate(f"t{i}:0", layer, layer_type, (1,), nbytes, i)


@pytest.mark.parametrize("text, expected", [("6GiB", 6 * 2**30), ("512 MiB", 512 * 2**20), ("8GB", 8 * 10**9),
                                            ("1024", 1024), (2048, 2048), ("0.5KiB", 512)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["lots", "6 GiBs", "-1GB", 0, True, ""])
def test_parse_bytes_rejects_with_the_accepted_forms(bad):
    with pytest.raises(ValueError, match="memory size"):
        parse_bytes(bad)


def test_n_tensors_takes_the_first_in_forward_order():
    candidates = [cand(3), cand(1), cand(2), cand(0)]
    assert [c.forward_index for c in Selection(n_tensors=2).select(candidates)] == [0, 1]
    assert len(Selection(n_tensors=-1).select(candidates)) == 4
    assert len(Selection().select(candidates)) == 4  # without a predictor to plan with, the default is all
    assert Selection(n_tensors=0).select(candidates) == []


def test_filters_by_size_layer_and_type():
    candidates = [cand(0, 10), cand(1, 1000, "dense", "Dense"), cand(2, 1000, "conv_a"), cand(3, 1000, "conv_b")]
    assert [c.forward_index for c in Selection(min_bytes=100).select(candidates)] == [1, 2, 3]
    assert [c.forward_index for c in Selection(exclude_types=("Dense",)).select(candidates)] == [0, 2, 3]
    assert [c.forward_index for c in Selection(include_layers=("conv_b",)).select(candidates)] == [3]
    assert [c.forward_index for c in Selection(exclude_layers=("conv_a",), min_bytes=100).select(candidates)] == [1, 3]


def test_budget_takes_the_fewest_swaps_and_few_predictions():
    candidates = [cand(i) for i in range(64)]
    calls = []

    def peak(swapped):
        calls.append(len(swapped))
        return 10_000 - 100 * len(swapped)

    search = fewest_swaps_within(candidates, 6_050, peak)
    assert len(search.chosen) == 40  # 10_000 - 100 * 40 = 6_000 <= 6_050, 39 would give 6_100
    assert search.peak_bytes == 6_000 and search.peak_bytes_without_lms == 10_000
    assert len(calls) == len(set(calls)) <= 24  # memoised, and a grid plus a refinement, not all 65


def test_budget_that_already_fits_swaps_nothing():
    assert fewest_swaps_within([cand(0)], 10**9, lambda swapped: 5).chosen == []


def test_impossible_budget_says_the_lowest_predicted_peak():
    with pytest.raises(BudgetError, match="lowest predicted device peak of any plan tried is 2.0 MiB"):
        fewest_swaps_within([cand(0)], 2**20, lambda swapped: 2 * 2**20)


def valley(bottom=25, slope_down=20, slope_up=30):
    """A peak that falls as the first `bottom` tensors are swapped, then rises: the swap-ins of the later
    ones arrive beside the backward pass's own work (EfficientNetB0 with Adam behaves so)."""
    return lambda swapped: (1000 - slope_down * len(swapped) if len(swapped) <= bottom
                            else 1000 - slope_down * bottom + slope_up * (len(swapped) - bottom))


def test_budget_does_not_assume_that_more_swaps_lower_the_peak():
    candidates = [cand(i) for i in range(64)]  # swapping all 64: 1000 - 500 + 30 * 39 = 1670, above the budget
    search = fewest_swaps_within(candidates, 640, valley())
    assert len(search.chosen) == 18 and search.peak_bytes == 640  # 1000 - 20 * 18


def test_default_plan_takes_the_lowest_peak_rather_than_every_tensor():
    candidates = [cand(i) for i in range(64)]
    plan = plan_swaps(Selection(), candidates, valley(), 0)
    assert len(plan.moved) == 25 and plan.peak_bytes == 500 and plan.peak_bytes_without_lms == 1000
    assert plan.rule is Rule.LOWEST_PEAK and plan.rule == "lowest predicted peak"


def test_default_plan_never_predicts_above_no_lms():
    candidates = [cand(i) for i in range(300)]
    plan = plan_swaps(Selection(), candidates, lambda swapped: 1000 + 3 * len(swapped), 400)
    assert plan.moved == () and plan.peak_bytes == plan.peak_bytes_without_lms == 1400


def test_among_peaks_within_one_percent_the_plan_moving_fewest_bytes_wins():
    candidates = [cand(i) for i in range(120)]

    def plateau(swapped):  # 505 from 10 swaps on, 500 from 100: within 1% of each other
        return 1000 if len(swapped) < 10 else 505 if len(swapped) < 100 else 500

    search = lowest_peak_plan(candidates, plateau)
    assert len(search.chosen) == 10 and search.lowest_peak_bytes == 500


def test_plan_search_cost_stays_small_for_resnet_sized_candidate_lists():
    candidates = [cand(i) for i in range(320)]
    calls = []

    def bumpy(swapped):
        calls.append(len(swapped))
        count = len(swapped)
        return 10_000 - 20 * count + (count % 7) * 15 + max(0, count - 211) * 60

    search = lowest_peak_plan(candidates, bumpy)
    assert len(set(calls)) <= 80
    exhaustive = min(range(321), key=lambda count: (bumpy(candidates[:count]), count))
    assert search.peak_bytes <= 1.01 * bumpy(candidates[:exhaustive])


def test_an_explicit_option_wins_over_the_device_capacity():
    candidates = [cand(i) for i in range(64)]
    peak = lambda swapped: 10_000 - 100 * len(swapped)  # noqa: E731
    assert plan_swaps(Selection(n_tensors=3), candidates, peak, capacity_bytes=20_000).rule is Rule.FIRST_N
    assert len(plan_swaps(Selection(n_tensors=-1), candidates, peak, capacity_bytes=20_000).moved) == 64
    budget = plan_swaps(Selection(), candidates, peak, budget_bytes=7_000, capacity_bytes=20_000)
    assert budget.rule is Rule.BUDGET and len(budget.moved) == 30 and budget.budget_bytes == 7_000


def test_where_the_step_fits_the_device_nothing_moves():
    candidates = [cand(i) for i in range(64)]
    peak = lambda swapped: 10_000 - 100 * len(swapped)  # noqa: E731
    capacity = int(10_000 / (1 - CAPACITY_HEADROOM)) + 1  # the plain step fits its usable part
    plan = plan_swaps(Selection(), candidates, peak, capacity_bytes=capacity)
    assert plan.moved == () and plan.rule is Rule.FITS_DEVICE and plan.fits and plan.budget_bytes < capacity


def test_where_it_does_not_the_fewest_bytes_that_fit_move():
    candidates = [cand(i) for i in range(64)]
    plan = plan_swaps(Selection(), candidates, valley(), capacity_bytes=800)  # usable: 640
    assert len(plan.moved) == 18 and plan.peak_bytes == 640 and plan.fits and plan.budget_bytes == 640
    assert plan.moved_bytes == 18 * 100


def test_where_nothing_fits_the_lowest_peak_and_a_note():
    plan = plan_swaps(Selection(), [cand(i) for i in range(64)], valley(), capacity_bytes=500)  # usable: 400
    assert len(plan.moved) == 25 and plan.peak_bytes == 500 and plan.fits is False
    assert "does not fit the device even so" in plan.note and "try a smaller batch" in plan.note


def test_without_a_predictor_the_default_moves_every_eligible_candidate():
    plan = plan_swaps(Selection(min_bytes=100), [cand(0, 10), cand(1), cand(2)], None)
    assert [c.forward_index for c in plan.moved] == [1, 2] and plan.rule is Rule.ALL and plan.peak_bytes is None


def shortest_within_whole(peaks, limit_bytes):
    """``_PrefixPeaks.shortest_within`` with every refining scan run whole: the reference."""
    while True:
        fitting = [count for count in sorted(peaks.peaks) if peaks.peaks[count] <= limit_bytes]
        if not fitting:
            return None
        below = [count for count in peaks.peaks if count < fitting[0]]
        if not below or fitting[0] - max(below) <= 1:
            return fitting[0]
        peaks.scan(max(below) + 1, fitting[0] - 1, 8)


def test_the_fewest_swaps_search_stops_scanning_at_the_first_fit_and_finds_what_a_full_scan_finds():
    """On 300 bumpy curves (the peak falls with swaps, with rises of up to a fifth of its fall, as a swap-in's buffer
    can raise it), the shortest fitting length equals the one the search finds scanning each interval whole, with
    never more predictions and fewer on most: a scan stops at its first length that fits."""
    rng = random.Random(7)
    fewer = 0
    for _ in range(300):
        n = rng.randrange(20, 300)
        curve = [10_000]
        for _ in range(n):
            curve.append(curve[-1] - rng.randrange(0, 100) + (rng.randrange(0, 120) if rng.random() < 0.2 else 0))
        candidates = [cand(i) for i in range(n)]
        budget = rng.randrange(min(curve) - 50, curve[0])

        def peak(swapped):
            return curve[len(swapped)]

        whole = _PrefixPeaks(candidates, peak)
        if whole(0) > budget:
            whole.scan(0, n, 16)
            if all(value > budget for value in whole.peaks.values()):
                whole.zoom_on_lowest()
        expected = 0 if whole(0) <= budget else shortest_within_whole(whole, budget)
        try:
            search = fewest_swaps_within(candidates, budget, peak)
        except BudgetError:
            assert expected is None
            continue
        assert len(search.chosen) == expected and search.plans_tried <= len(whole.peaks)
        fewer += search.plans_tried < len(whole.peaks)
    assert fewer > 150
