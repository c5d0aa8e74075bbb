"""Distribution-free confidence interval of a median, from the order statistics of the samples.

For n independent samples of a continuous distribution, the number of samples below the true
median is Binomial(n, 1/2). The interval [x_(j), x_(k)] of the sorted samples (1-based ranks)
covers the median with probability P(j <= B < k) for B ~ Binomial(n, 1/2). The ranks are the
symmetric pair (j, n + 1 - j) with the largest j whose coverage still reaches the level: the
narrowest such interval that needs no assumption about the shape of the timing distribution
(timings are skewed and often bimodal). Below 6 samples no pair reaches 95% (n = 5: the full range
covers 93.75%): the interval is then the full range, and `covered` says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

LEVEL = 0.95
# Calls at least this long stop at 3 samples under the adaptive protocol (longca.measure.timer),
# too few for any pair to reach LEVEL: their interval is the full range.
LONG_CALL_MS = 1000.0


@dataclass(frozen=True)
class MedianCI:
    low: float
    high: float
    covered: bool  # the interval reaches the level (enough samples)

    def half_width(self, median: float) -> float:
        """The larger distance from the median to an end, as a fraction of the median."""
        if median <= 0:
            return math.inf
        return max(median - self.low, self.high - median) / median


@lru_cache(maxsize=4096)
def ranks(n: int, level: float = LEVEL) -> tuple[int, int, bool]:
    """(j, k, covered): 1-based ranks of the interval's ends for n samples.

    The coverage of (j, n + 1 - j) is P(j <= B <= n - j) = 1 - 2 P(B <= j - 1) by symmetry, so j is
    the count of leading binomial terms whose sum stays within (1 - level) / 2 (log-space terms: no
    overflow at any n)."""
    if n < 1:
        raise ValueError(f"need at least one sample, got n={n}")
    tail = (1.0 - level) / 2.0
    log_total = n * math.log(2.0)
    acc = 0.0
    for i in range(n // 2 + 1):
        acc += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - log_total)
        if acc > tail * (1 + 1e-12):
            break
    j = i  # terms 0..i-1 sum to at most the tail
    if j == 0:
        return 1, n, False
    return j, n + 1 - j, True


def median_ci(samples: Sequence[float], level: float = LEVEL) -> MedianCI:
    """The distribution-free `level` interval of the median of `samples`."""
    xs = sorted(samples)
    j, k, covered = ranks(len(xs), level)
    return MedianCI(low=float(xs[j - 1]), high=float(xs[k - 1]), covered=covered)


def min_samples(level: float = LEVEL) -> int:
    """The fewest samples whose interval reaches `level` (6 at 95%)."""
    n = 1
    while not ranks(n, level)[2]:
        n += 1
    return n
