import pytest

from lms_magic.lms.plan import BudgetError, Candidate, Selection, fewest_swaps_within, parse_bytes


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
    assert Selection(n_tensors=0).select(candidates) == []


def test_filters_by_size_layer_and_type():
    candidates = [cand(0, 10), cand(1, 1000, "dense", "Dense"), cand(2, 1000, "conv_a"), cand(3, 1000, "conv_b")]
    assert [c.forward_index for c in Selection(min_bytes=100).select(candidates)] == [1, 2, 3]
    assert [c.forward_index for c in Selection(exclude_types=("Dense",)).select(candidates)] == [0, 2, 3]
    assert [c.forward_index for c in Selection(include_layers=("conv_b",)).select(candidates)] == [3]
    assert [c.forward_index for c in Selection(exclude_layers=("conv_a",), min_bytes=100).select(candidates)] == [1, 3]


@pytest.mark.parametrize("n_tensors", [-2, 1.5, "all"])
def test_bad_n_tensors_says_what_is_allowed(n_tensors):
    with pytest.raises(ValueError, match="-1 \\(all\\), 0 \\(LMS off\\)"):
        Selection(n_tensors=n_tensors)


def test_budget_takes_the_fewest_swaps_and_few_predictions():
    candidates = [cand(i) for i in range(64)]
    calls = []

    def peak(swapped):
        calls.append(len(swapped))
        return 10_000 - 100 * len(swapped)

    chosen = fewest_swaps_within(candidates, 6_050, peak)
    assert len(chosen) == 40  # 10_000 - 100 * 40 = 6_000 <= 6_050, 39 would give 6_100
    assert len(calls) <= 10


def test_budget_that_already_fits_swaps_nothing():
    assert fewest_swaps_within([cand(0)], 10**9, lambda swapped: 5) == []


def test_impossible_budget_says_the_predicted_peak():
    with pytest.raises(BudgetError, match="predicted device peak is 2.0 MiB even with all 1 eligible"):
        fewest_swaps_within([cand(0)], 2**20, lambda swapped: 2 * 2**20)
