"""Interval math of closed-loop evaluation: Wilson intervals, paired bootstrap, Bonferroni.

Small pure functions over plain numbers; ``memorywalker eval`` composes them (docs/eval.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from memorywalker.errors import InputError

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def z_of(alpha: float) -> float:
    """Two-sided normal quantile for level ``1 - alpha``: z such that P(|Z| > z) = alpha.

    >>> round(z_of(0.05), 4), round(z_of(0.025), 4)
    (1.96, 2.2414)
    """
    return NormalDist().inv_cdf(1 - alpha / 2)


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``k / n`` (Wilson 1927).

    centre = (p + z²/2n) / (1 + z²/n),  half = z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n).

    For 7/10 at z = 1.96: p = 0.7, z²/n = 0.38416, centre = 0.89208 / 1.38416 = 0.64449,
    half = 1.96·sqrt(0.021 + 0.0096040) / 1.38416 = 0.24772, so (0.39677, 0.89221).

    >>> [round(x, 4) for x in wilson_interval(7, 10)]
    [0.3968, 0.8922]
    >>> wilson_interval(0, 0)
    (0.0, 1.0)
    """
    if n == 0:
        return 0.0, 1.0  # no trials: nothing is known
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bonferroni(alpha: float, m: int) -> float:
    """Per-comparison level when ``m`` comparisons are read together: alpha / m (family-wise error <= alpha).

    >>> bonferroni(0.05, 4)
    0.0125
    """
    if m < 1:
        raise ValueError(f"number of comparisons must be >= 1, got {m}")
    return alpha / m


def paired_differences(a: dict[str, float], b: dict[str, float]) -> list[float]:
    """``a[t] - b[t]`` per task ``t`` present in both (sorted by task): the pairing is by task and seed.

    >>> paired_differences({"t1": 1.0, "t2": 0.0, "t3": 1.0}, {"t1": 0.0, "t2": 0.0, "t3": 1.0})
    [1.0, 0.0, 0.0]
    """
    missing = sorted(set(a) ^ set(b))
    if missing:
        raise InputError(f"paired comparison needs the same tasks on both sides; unpaired: {missing[:3]}")
    return [a[t] - b[t] for t in sorted(a)]


def paired_seed_differences(a: dict[str, dict[int, float]], b: dict[str, dict[int, float]]) -> dict[str, list[float]]:
    """``a[t][s] - b[t][s]`` per task ``t`` and seed ``s`` (sorted), for :func:`paired_bootstrap_nested`.

    >>> paired_seed_differences({"t": {0: 1.0, 1: 0.0}}, {"t": {0: 0.0, 1: 1.0}})
    {'t': [1.0, -1.0]}
    """
    missing = sorted({(t, s) for t in a for s in a[t]} ^ {(t, s) for t in b for s in b[t]})
    if missing:
        raise InputError(f"paired comparison needs the same tasks and seeds on both sides; unpaired: {missing[:3]}")
    return {t: [a[t][s] - b[t][s] for s in sorted(a[t])] for t in sorted(a)}


def paired_bootstrap(diffs: Sequence[float], *, alpha: float = 0.05, resamples: int = 10_000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean of the per-task paired differences and its percentile bootstrap interval at level 1 - alpha.

    Tasks are resampled with replacement (``resamples`` times, ``numpy.random.default_rng(seed)``); the
    interval is the (alpha/2, 1 - alpha/2) quantiles (numpy's default linear interpolation) of the
    resampled means. Returns ``(mean, low, high)``.

    On diffs [1, 0, 0, 1] the mean is 0.5; every resampled mean lies in {0, .25, .5, .75, 1}, so the
    interval is within [0, 1]; all-equal diffs [0.5, 0.5] give (0.5, 0.5, 0.5).

    >>> paired_bootstrap([0.5, 0.5])
    (0.5, 0.5, 0.5)
    """
    x = np.asarray(diffs, dtype=np.float64)  # [T]
    if x.size == 0:
        raise InputError("paired bootstrap needs at least one task")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))  # [R, T] task indices drawn with replacement
    means = x[idx].mean(axis=1)  # [R]
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(x.mean()), float(low), float(high)


def paired_bootstrap_nested(diffs: dict[str, Sequence[float]], *, alpha: float = 0.05, resamples: int = 10_000,
                            seed: int = 0) -> tuple[float, float, float]:
    """:func:`paired_bootstrap` for tasks evaluated with several seeds each: ``diffs[task]`` is the paired
    difference per seed (the model's and the baseline's episodes share the seed). Each resample draws the
    tasks with replacement and, within each drawn task, its seeds with replacement (a two-stage bootstrap,
    Davison & Hinkley 1997, 2.4), so the interval carries the seed-to-seed variation inside a task too; the
    estimate is the mean over tasks of each task's mean. Where every task has one seed this is
    :func:`paired_bootstrap` of those differences, with the same draws.

    One task whose two seeds differ by [1, -1]: the per-task mean is 0, and resampling task means alone would
    give the interval [0, 0]. Here each resample's mean is 1 (both draws the first seed), 0 or -1, with
    probabilities 1/4, 1/2, 1/4, so the 95 % interval is [-1, 1].

    >>> paired_bootstrap_nested({"t": [1.0, -1.0]})
    (0.0, -1.0, 1.0)
    >>> paired_bootstrap_nested({"a": [1.0], "b": [0.0]}) == paired_bootstrap([1.0, 0.0])
    True
    """
    tasks = [np.asarray(diffs[t], dtype=np.float64) for t in sorted(diffs)]
    if not tasks or any(x.size == 0 for x in tasks):
        raise InputError("paired bootstrap needs at least one task, each with at least one seed")
    if all(x.size == 1 for x in tasks):
        return paired_bootstrap([float(x[0]) for x in tasks], alpha=alpha, resamples=resamples, seed=seed)
    rng = np.random.default_rng(seed)
    n = len(tasks)
    idx = rng.integers(0, n, size=(resamples, n))  # [R, T] tasks drawn with replacement
    task_means = np.zeros((resamples, n))
    for t, x in enumerate(tasks):  # every task's seeds redrawn in every resample (used where the task was drawn)
        task_means[:, t] = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    means = np.take_along_axis(task_means, idx, axis=1).mean(axis=1)  # [R]
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(np.mean([x.mean() for x in tasks])), float(low), float(high)


def cost_per_accepted(total: float, accepted: int) -> float | None:
    """All spend (tokens or turns over every trial, failed ones included) per accepted task; None at 0.

    >>> cost_per_accepted(1200, 3), cost_per_accepted(500, 0)
    (400.0, None)
    """
    return total / accepted if accepted else None
