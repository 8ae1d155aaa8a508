"""Bounded parsing: a size limit and a nesting-depth limit per record, checked before anything deeper runs.

A JSONL line of 50 MB, or ``[[[[…]]]]`` nested 100,000 levels, is hostile input, not a record: the
first would take minutes to tokenize, the second raises ``RecursionError`` in ``json``, pydantic or
any recursive walk. Every reader (``TrajectoryReader``, the importers) rejects such a record with a
reason code and goes on with the next one:

* ``record_too_large`` — the line is longer than ``max_bytes`` (its bytes are not even held: the
  reader skips to the next newline);
* ``too_deep`` — arrays/objects nest deeper than ``max_depth`` levels (a trajectory record needs ~10;
  tool arguments and JSON schemas add their own).

Both are configurable per reader (``RecordLimits(...)``) and for every command through the
environment: ``MEMORYWALKER_MAX_RECORD_BYTES`` (default 32 MiB) and ``MEMORYWALKER_MAX_RECORD_DEPTH``
(default 100).

>>> nesting_depth({"a": [1, {"b": []}]}, limit=100)  # object, array, object, array
4
>>> loads(b"[" * 5000 + b"]" * 5000, RecordLimits())
Traceback (most recent call last):
...
memorywalker.records.validate.RecordError: too_deep: JSON nests deeper than the recursion limit (max_depth 100)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.validate import RecordError

DEFAULT_MAX_BYTES = 32 << 20
DEFAULT_MAX_DEPTH = 100


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"{name}={text!r}: not an integer") from None
    if value < 1:
        raise InputError(f"{name}={value}: must be >= 1")
    return value


@dataclass(frozen=True)
class RecordLimits:
    """Per-record bounds; :meth:`from_env` reads the ``MEMORYWALKER_MAX_RECORD_*`` variables."""

    max_bytes: int = DEFAULT_MAX_BYTES  # longest accepted line (newline excluded)
    max_depth: int = DEFAULT_MAX_DEPTH  # deepest accepted nesting of arrays and objects

    @classmethod
    def from_env(cls) -> RecordLimits:
        return cls(max_bytes=_env_int("MEMORYWALKER_MAX_RECORD_BYTES", DEFAULT_MAX_BYTES),
                   max_depth=_env_int("MEMORYWALKER_MAX_RECORD_DEPTH", DEFAULT_MAX_DEPTH))


def nesting_depth(obj: Any, limit: int) -> int:
    """Levels of nested lists/dicts in ``obj`` (a scalar is 0, ``[]`` is 1), iteratively; the walk
    stops as soon as it passes ``limit`` (the value returned is then ``limit + 1``)."""
    if not isinstance(obj, dict | list):
        return 0
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if depth > limit:
                return depth
        for v in node.values() if isinstance(node, dict) else node:
            if isinstance(v, dict | list):
                stack.append((v, depth + 1))
    return deepest


def check_size(size: int, limits: RecordLimits) -> None:
    if size > limits.max_bytes:
        raise RecordError("record_too_large", f"{size:,} bytes, more than max_bytes {limits.max_bytes:,} "
                          "(MEMORYWALKER_MAX_RECORD_BYTES)")


def check_depth(obj: Any, limits: RecordLimits) -> None:
    if nesting_depth(obj, limits.max_depth) > limits.max_depth:
        raise RecordError("too_deep", f"JSON nests deeper than max_depth {limits.max_depth} "
                          "(MEMORYWALKER_MAX_RECORD_DEPTH)")


def loads(text: str | bytes, limits: RecordLimits) -> Any:
    """``json.loads`` with both limits; raises :class:`RecordError` (``record_too_large``, ``too_deep``)
    or ``json.JSONDecodeError`` / ``UnicodeDecodeError`` as ``json.loads`` does."""
    check_size(len(text), limits)
    try:
        obj = json.loads(text)
    except RecursionError:  # json's C scanner guards its own recursion: deeper than ~1,000 levels
        raise RecordError("too_deep", f"JSON nests deeper than the recursion limit (max_depth {limits.max_depth})") from None
    check_depth(obj, limits)
    return obj
