"""The paired tests every comparison of arms rests on (analysis/paired.py), on counts worked by hand."""
import math

import pytest

from analysis.paired import binomial_two_sided, compare_failures, compare_values, least_discordant, worded


def test_mcnemar_exact_on_the_discordant_pairs_alone():
    # 9 cells: the arm failed on 1, the reference on 5, both on 1: 4 vs 0 discordant -> 2 x 0.5^4
    arm = [True, False, False, False, False, False, False, False, False]
    reference = [True, True, True, True, True, False, False, False, False]
    got = compare_failures(arm, reference)
    assert (got.cells, got.arm_failed, got.reference_failed, got.arm_only, got.reference_only) == (9, 1, 5, 0, 4)
    assert got.p == pytest.approx(0.125)
    assert got.difference == pytest.approx(-4 / 9) and -1 <= got.low < got.difference < got.high <= 1
    assert compare_failures([], []).cells == 0 and math.isnan(compare_failures([], []).p)


def test_the_fewest_pairs_a_paired_test_can_show_a_difference_on():
    """All pairs one way: 5 give p = 0.0625, 6 give 0.031 (at 0.05); at 0.01 it takes 8 (0.0078 against 0.0156)."""
    assert least_discordant() == 6 and binomial_two_sided(0, 5) > 0.05 > binomial_two_sided(0, 6)
    assert least_discordant(0.01) == 8 and binomial_two_sided(0, 7) > 0.01 > binomial_two_sided(0, 8)


def test_the_sign_test_counts_higher_and_lower_cells():
    # higher on 15, lower on 2 of 17: two-sided binomial p = 2 x P(X <= 2 | 17, 0.5) = 2 x 154 / 2^17
    assert binomial_two_sided(2, 17) == pytest.approx(2 * (1 + 17 + 136) / 2 ** 17)
    got = compare_values([0.5] * 15 + [0.1, 0.1], [0.3] * 15 + [0.2, 0.2])
    assert (got.cells, got.higher, got.lower) == (17, 15, 2)
    assert got.sign_p == pytest.approx(2 * 154 / 2 ** 17) and got.low < got.mean < got.high
    assert compare_values([0.5, None], [0.4, 0.3]).cells == 1  # a missing value drops its pair


def test_the_words_follow_the_p_value_and_its_direction():
    assert worded(0.01, "x fails less often") == "shown: x fails less often (p = 0.010)"
    assert worded(0.2, "x fails less often") == "not shown: x fails less often (p = 0.200)"
    assert worded(0.01, "x fails less often", holds=False) == "the opposite shown: not x fails less often (p = 0.010)"
    assert worded(math.nan, "x") == "not testable: x"
    # an arm that failed more often, significantly, is never worded as failing less often
    more = compare_failures([True] * 6 + [False] * 3, [False] * 9)
    assert more.p < 0.05 and more.difference > 0


def test_action_comparisons_pool_both_sharing_modes_as_pairs_of_seed_and_sharing():
    """studies/interventions' H5 pairs cells by seed and sharing: the pooled row counts every
    (sharing, seed) pair once, beside the per-sharing rows."""
    from analysis.arms import POOLED, action_comparisons

    rows = []
    for sharing, fails in (("ip", [1, 1, 0]), ("sp", [1, 1, 1])):
        for seed, failed in enumerate(fails):
            rows.append({"sharing": sharing, "seed": seed, "action": "alert", "failed_at": 40 if failed else "",
                         "final_accuracy": 0.2})
            rows.append({"sharing": sharing, "seed": seed, "action": "mitigate", "failed_at": "",
                         "final_accuracy": 0.3})
    found = {r["sharing"]: r for r in action_comparisons(rows)}
    assert set(found) == {"ip", "sp", POOLED} and list(found)[-1] == POOLED
    assert found["ip"]["seeds"] == 3 and found[POOLED]["seeds"] == 6
    assert "(5 vs 0 discordant)" in found[POOLED]["failed (paired)"]
