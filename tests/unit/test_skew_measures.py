"""The comparison measures, against the values their papers state."""

import pytest

from floering.chaos.skew_measures import distribution_cost, imbalance, load_std_percent, skew


@pytest.mark.parametrize("loads, expected", [
    ([25, 25, 25, 25], 0.0),          # the Ray paper's WL2: S = 0
    ([100, 0, 0, 0], 1.0),            # WL3: one letter repeated, S = 1
    ([85, 5, 5, 5], 0.8),             # WL4 under halving: S = 0.8
    ([40, 20, 20, 20], 0.2),          # WL5 under halving: S = 0.2
    ([7], 0.0), ([0, 0, 0], 0.0),
])
def test_skew_is_the_papers_normalised_excess_of_the_busiest_reducer(loads, expected):
    assert skew(loads) == pytest.approx(expected)


def test_skew_of_one_tuple_over_several_reducers_is_total():
    assert skew([1, 0, 0]) == 1.0


def test_imbalance_std_and_distribution_cost():
    assert imbalance([10, 10, 10, 10]) == 0 and imbalance([40, 0, 0, 0]) == 3.0
    assert load_std_percent([25, 25, 25, 25]) == 0.0
    assert load_std_percent([100, 0]) == pytest.approx(50.0)
    assert distribution_cost({"a": ["n0"], "b": ["n0", "n1", "n1"]}) == 1.5
    with pytest.raises(ValueError):
        skew([])
