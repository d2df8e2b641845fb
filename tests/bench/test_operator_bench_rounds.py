"""The operator benchmark's rounds: this tree over the baseline, one ratio per round, then their median."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.support.scripts import load_script

CONVERGE = "last create -> all converged (s)"
CPU = "operator CPU (ms/resource)"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench_operator_cluster")


def test_each_round_is_compared_within_itself_and_the_median_taken(bench: ModuleType) -> None:
    # The machine drifts between rounds (the second round is 30% slower for both trees), and the
    # change is 10% within each round: the ratios say 0.9 however the absolute figures moved.
    rounds = [
        ({CONVERGE: 70.0, CPU: 14.0}, {CONVERGE: 63.0, CPU: 14.0}),
        ({CONVERGE: 91.0, CPU: 16.0}, {CONVERGE: 81.9, CPU: 15.2}),
        ({CONVERGE: 80.0, CPU: 15.0}, {CONVERGE: 72.0, CPU: 16.5}),
    ]
    got = bench.round_ratios(rounds)
    assert got[CONVERGE] == pytest.approx((0.9, 0.9, 0.9))
    assert got[CPU] == pytest.approx((1.0, 0.95, 1.1))


def test_a_round_without_a_figure_is_left_out_of_that_figure_only(bench: ModuleType) -> None:
    # A leg that did not converge reports nothing: its round cannot be compared.
    rounds = [({CONVERGE: 70.0, CPU: 14.0}, {}), ({CONVERGE: 80.0, CPU: 10.0}, {CONVERGE: 60.0, CPU: 12.0})]
    assert bench.round_ratios(rounds) == {CONVERGE: (0.75, 0.75, 0.75), CPU: (1.2, 1.2, 1.2)}
    assert bench.round_ratios([({}, {CPU: 3.0})]) == {}
