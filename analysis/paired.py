"""Paired tests for arms that share their cells (an intervention or a diagnosis: every arm branched
from the same checkpoint with the same random numbers), and the words that follow their p-values.

- failures: McNemar's exact test (the discordant pairs under a fair coin) and the difference of the
  two failure rates with Newcombe's interval for paired proportions (his method 10);
- final accuracy: the sign test and Wilcoxon's signed-rank test on the per-cell differences, the mean
  difference with its t interval and how many cells were higher / lower.

A claim is worded "shown" only when its test's p is below `ALPHA`; otherwise "not shown", with the p.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

ALPHA = 0.05


def wilson(k: int, n: int, z: float = 1.959964) -> Tuple[float, float]:
    """95% Wilson score interval of a proportion k/n (sound at 0 and n, unlike the normal one)."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def binomial_two_sided(k: int, n: int) -> float:
    """Exact two-sided binomial p of k successes in n under p = 1/2 (1.0 for n = 0)."""
    if n == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(k, n, 0.5).pvalue)


def least_discordant(alpha: float = ALPHA) -> int:
    """The fewest discordant pairs, all one way, whose exact two-sided sign test reaches p < alpha:
    a paired comparison of fewer pairs cannot be shown whatever happens in them (6 at 0.05)."""
    pairs = 1
    while binomial_two_sided(0, pairs) >= alpha:
        pairs += 1
    return pairs


@dataclass(frozen=True)
class FailureComparison:
    """An arm against its reference on the same cells: failures of each, the discordant cells (only
    the arm failed: `arm_only`; only the reference: `reference_only`), the difference of rates with
    its 95% interval and McNemar's exact p."""

    cells: int
    arm_failed: int
    reference_failed: int
    arm_only: int
    reference_only: int
    difference: float
    low: float
    high: float
    p: float

    def text(self) -> str:
        if not self.cells:
            return "no paired cells"
        return (f"{self.arm_failed}/{self.cells} vs {self.reference_failed}/{self.cells} failed, difference "
                f"{self.difference:+.2f} [{self.low:+.2f}, {self.high:+.2f}], McNemar exact p = {self.p:.3f} "
                f"({self.reference_only} vs {self.arm_only} discordant)")


def compare_failures(arm: Sequence[bool], reference: Sequence[bool]) -> FailureComparison:
    """McNemar's exact test and Newcombe's paired interval (method 10) of P(arm fails) - P(reference fails)."""
    pairs = list(zip(arm, reference))
    n = len(pairs)
    both = sum(a and r for a, r in pairs)
    b = sum(a and not r for a, r in pairs)  # the arm failed alone
    c = sum(r and not a for a, r in pairs)  # the reference failed alone
    if n == 0:
        return FailureComparison(0, 0, 0, 0, 0, math.nan, math.nan, math.nan, math.nan)
    d = n - both - b - c
    p1, p2 = (both + b) / n, (both + c) / n
    (l1, u1), (l2, u2) = wilson(both + b, n), wilson(both + c, n)
    product = (both + b) * (c + d) * (both + c) * (b + d)
    phi = 0.0
    if product > 0:
        numerator = both * d - b * c
        phi = (max(numerator - n / 2, 0.0) if numerator > 0 else numerator) / math.sqrt(product)
    delta = p1 - p2
    low = delta - math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    high = delta + math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    return FailureComparison(n, both + b, both + c, b, c, delta, max(-1.0, low), min(1.0, high),
                             binomial_two_sided(min(b, c), b + c))


@dataclass(frozen=True)
class DifferenceTest:
    """Per-cell differences arm - reference of one number (final accuracy): how many higher and lower,
    the mean with its 95% t interval, the sign test's and Wilcoxon's p."""

    cells: int
    higher: int
    lower: int
    mean: float
    low: float
    high: float
    sign_p: float
    wilcoxon_p: float

    def text(self) -> str:
        if not self.cells:
            return "no paired cells"
        spread = "" if math.isnan(self.low) else f" [{self.low:+.3f}, {self.high:+.3f}]"
        return (f"{self.mean:+.3f}{spread}, higher on {self.higher} and lower on "
                f"{self.lower} of {self.cells}, sign test p = {self.sign_p:.3f}, Wilcoxon p = {self.wilcoxon_p:.3f}")


def compare_values(arm: Sequence[Optional[float]], reference: Sequence[Optional[float]]) -> DifferenceTest:
    from scipy import stats

    diffs = [a - r for a, r in zip(arm, reference) if a is not None and r is not None
             and math.isfinite(a) and math.isfinite(r)]
    n = len(diffs)
    if n == 0:
        return DifferenceTest(0, 0, 0, math.nan, math.nan, math.nan, math.nan, math.nan)
    higher, lower = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    mean = sum(diffs) / n
    if n >= 2 and any(d != diffs[0] for d in diffs):
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    else:
        half = math.nan if n < 2 else 0.0
    nonzero = [d for d in diffs if d != 0]
    wilcoxon_p = float(stats.wilcoxon(nonzero).pvalue) if len(nonzero) >= 1 else 1.0
    return DifferenceTest(n, higher, lower, mean, mean - half, mean + half,
                          binomial_two_sided(min(higher, lower), higher + lower), wilcoxon_p)


def worded(p: float, claim: str, alpha: float = ALPHA, holds: bool = True) -> str:
    """'shown: <claim> (p = 0.012)' or 'not shown: <claim> (p = 0.130)': the words follow the test.
    `holds`: the data lean the claim's way; a significant result the other way is 'the opposite shown'."""
    if p is None or math.isnan(p):
        return f"not testable: {claim}"
    if p < alpha and not holds:
        return f"the opposite shown: not {claim} (p = {p:.3f})"
    return f"{'shown' if p < alpha else 'not shown'}: {claim} (p = {p:.3f})"
