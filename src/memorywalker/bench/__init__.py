"""Benchmarks (not timed tests): training engines (:mod:`~memorywalker.bench.engines`), rollouts
(:mod:`~memorywalker.bench.rollouts`), peak memory (:mod:`~memorywalker.bench.memory`) and random models at
real shapes (:mod:`~memorywalker.bench.shapes`). The ``memorywalker bench`` commands print their results."""
