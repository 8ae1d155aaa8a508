"""What bad input is: the one exception type for an input a user can fix.

:class:`InputError` is raised where input is judged — a config value, a record, a request, a file, a
name that is not in a registry — and says what is wrong in words the user can act on. The CLI
(``memorywalker.cli.errors``) prints it as one line and exits 2. Every other exception, a plain
``ValueError`` from an internal check included, is treated as a bug: one line that says so and how to
get the traceback (``--debug``), exit 1.

It is a ``ValueError``, so code that catches ``ValueError`` (a reader turning a bad record into a
reject, a test with ``pytest.raises(ValueError)``) keeps catching it.

>>> issubclass(InputError, ValueError)
True
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class InputError(ValueError):
    """Bad input, named with its cause: the CLI reports it in one line and exits 2."""


@contextmanager
def judging(what: object, refusal: str) -> Iterator[None]:
    """Around a call that judges the user's input ``what`` and refuses it with a plain ``ValueError`` (a
    library's loader: transformers says "Unrecognized model in DIR" for a directory without a model):
    that refusal is raised as an :class:`InputError` naming ``what``.

    >>> with judging("runs/x", "not a model transformers can load"):
    ...     raise ValueError("Unrecognized model in runs/x.")
    Traceback (most recent call last):
    ...
    memorywalker.errors.InputError: runs/x: not a model transformers can load (Unrecognized model in runs/x.)
    """
    try:
        yield
    except InputError:
        raise
    except ValueError as e:
        raise InputError(f"{what}: {refusal} ({' '.join(str(e).split())})") from e
