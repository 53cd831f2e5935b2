"""Target verdicts and paired ratios, on exact inputs."""

from __future__ import annotations

import math

import pytest

from bench.harness.report import SuiteResult, Target, format_targets, paired


@pytest.mark.parametrize(("value", "op", "bound", "met"), [
    (0.9, ">=", 0.9, True), (0.89, ">=", 0.9, False), (1.2, "<=", 1.2, True),
    (1.21, "<=", 1.2, False), (math.nan, ">=", 0.9, False), (math.nan, "<=", 5.0, False)])
def test_a_target_is_met_on_its_bound_and_never_when_not_measured(
        value: float, op: str, bound: float, met: bool) -> None:
    assert Target("t", value, op, bound).met is met


def test_target_lines_carry_the_verdict_the_value_and_the_bound() -> None:
    assert Target("REST binary T=16 fp32 c=1: service / lookup floor throughput", 0.8123,
                  ">=", 0.8).line() == ("[MET    ] REST binary T=16 fp32 c=1: service / lookup "
                                        "floor throughput = 0.81 (target >= 0.8)")
    assert Target("p50", 1.25, "<=", 1.2).line() == "[NOT MET] p50 = 1.25 (target <= 1.2)"
    assert Target("T=16 fp32 c=16 unary: service / gRPC ceiling throughput", 0.744, ">=", 0.85,
                  floor=0.8249).line() == (
        "[NOT MET] T=16 fp32 c=16 unary: service / gRPC ceiling throughput = 0.74 "
        "(target >= 0.85; the lookup floor: 0.82)")


def test_paired_is_the_median_of_per_round_ratios_not_the_ratio_of_medians() -> None:
    service, ceiling = [60.0, 70.0, 200.0], [100.0, 50.0, 80.0]
    # Per round: 0.6, 1.4, 2.5; the ratio of the medians would be 70 / 80 = 0.875.
    assert paired([service], [ceiling]) == pytest.approx(1.4)


def test_paired_ratio_of_ratios_and_rounds_without_a_reference() -> None:
    stream, unary = [300.0, 200.0, 250.0], [100.0, 100.0, 100.0]
    c_stream, c_unary = [400.0, 400.0, 300.0], [100.0, 200.0, 100.0]
    # (s/u) / (cs/cu) per round: 3/4, 2/2, 2.5/3
    assert paired([stream, c_unary], [unary, c_stream]) == pytest.approx(2.5 / 3)
    assert paired([[1.0, 2.0]], [[0.0, 4.0]]) == 0.5  # a round with nothing measured is out
    assert math.isnan(paired([[1.0]], [[0.0]]))


def test_the_target_block_counts_verdicts_and_warns_of_a_loaded_machine() -> None:
    targets = [Target("a", 1.0, ">=", 0.9), Target("b", 2.0, "<=", 1.2)]
    assert format_targets(targets, {"reps": 3, "ids": "uniform", "cpus": 2,
                                    "loadavg_before": 0.5}).splitlines() == [
        "targets (medians of 3 interleaved rounds; uniform ids): 1 of 2 met",
        "  [MET    ] a = 1.00 (target >= 0.9)",
        "  [NOT MET] b = 2.00 (target <= 1.2)"]
    quick = format_targets(targets, {"reps": 1, "quick": True, "cpus": 2, "loadavg_before": 1.5})
    assert quick.splitlines()[-2:] == [
        "  (--quick: tiny sizes; these verdicts say nothing about the targets)",
        "  warning: load average 1.5 on 2 CPUs before the run: other work on this machine "
        "skewed these figures"]


def test_a_suites_json_carries_each_target_with_its_verdict() -> None:
    result = SuiteResult("s", {"x": 1}, "", [Target("a", 0.5, ">=", 0.9),
                                              Target("b", 0.7, ">=", 0.85, floor=0.8)])
    assert result.json() == {"x": 1, "targets": [
        {"name": "a", "value": 0.5, "op": ">=", "bound": 0.9, "floor": None, "met": False},
        {"name": "b", "value": 0.7, "op": ">=", "bound": 0.85, "floor": 0.8, "met": False}]}
