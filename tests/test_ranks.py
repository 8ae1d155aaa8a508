"""The test helper that starts gloo ranks (tests/ranks.py) reports a rank that dies without a Python
traceback with what that rank wrote to stderr, and a rank that raises with its exception."""

from __future__ import annotations

import os
import sys

import pytest
import torch.multiprocessing as mp

from ranks import spawn


def _abort_on_rank_1(rank: int, world: int) -> None:
    print(f"rank {rank} of {world} about to abort", file=sys.stderr, flush=True)
    if rank == 1:
        os.abort()


def _raise_on_rank_0(rank: int, world: int) -> None:
    if rank == 0:
        raise ValueError("rank 0 refuses")


def test_a_rank_killed_by_a_signal_fails_the_test_with_its_stderr(tmp_path):
    with pytest.raises(AssertionError, match=r"(?s)SIGABRT.*--- rank 1\nrank 1 of 2 about to abort"):
        spawn(_abort_on_rank_1, log_dir=tmp_path)


def test_a_rank_that_raises_fails_the_test_with_its_exception(tmp_path):
    with pytest.raises(mp.ProcessRaisedException, match="rank 0 refuses"):
        spawn(_raise_on_rank_0, log_dir=tmp_path)
