"""The doctests in module docstrings are examples with numbers; they run as part of the suite."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import memorywalker

MODULES = sorted(m.name for m in pkgutil.walk_packages(memorywalker.__path__, "memorywalker."))


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} doctest examples failed"
