"""Closed-loop evaluation: run checkpoints on suites and compare them paired (:mod:`~memorywalker.eval.evaluate`,
``memorywalker eval``), in transfer regimes (:mod:`~memorywalker.eval.transfer`), and the greedy held-out
episodes the demo scores (:func:`~memorywalker.eval.evaluate.play`). The statistics are pure functions of
the trial rows (:mod:`memorywalker.metrics.closed_loop`)."""
