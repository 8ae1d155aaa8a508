"""Output files a reader never sees half of, and environment failures that name their path.

Every file memorywalker writes for someone else to read (import outputs and rejects files, trajectory
JSONL, config and manifest JSON) goes through :func:`atomic_write`: the new content is written to a
temporary file in the same directory and renamed over the target only once it is complete and on
disk. A reader sees the old file or the new one, never a mix; two writers racing for one path leave
one complete output (the last rename); a failure (a full disk, a killed process) leaves the previous
file, and the temporary file is removed.

A failed ``write()`` or ``close()`` raises an :class:`OSError` without a file name ("[Errno 28] No
space left on device"); :func:`naming` puts the path back, so the CLI prints one line
``PATH: No space left on device`` and exits 2 (``memorywalker.cli.errors``).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> with atomic_write(d / "out.txt") as f:
...     _ = f.write("complete")
>>> (d / "out.txt").read_text(), sorted(p.name for p in d.iterdir())
('complete', ['out.txt'])
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def as_os_error(e: BaseException, path: str | os.PathLike) -> OSError | None:
    """``e`` as an :class:`OSError` naming ``path`` when it is an I/O failure, else None.

    Covers a plain OSError without a file name, and the libraries that wrap the system error in their
    own exception: safetensors (``SafetensorError: ... (os error 28)``).

    >>> str(as_os_error(OSError(28, "No space left on device"), "ckpt/model.safetensors"))
    "[Errno 28] No space left on device: 'ckpt/model.safetensors'"
    >>> as_os_error(ValueError("not I/O"), "x") is None
    True
    """
    if isinstance(e, OSError):
        if e.filename is not None or e.errno is None:
            return e
        return OSError(e.errno, e.strerror or os.strerror(e.errno), str(path))
    m = re.search(r"\(os error (\d+)\)", str(e))
    if m:
        code = int(m.group(1))
        return OSError(code, os.strerror(code), str(path))
    return None


@contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise I/O failures inside the block as an :class:`OSError` naming ``path``."""
    try:
        yield
    except Exception as e:
        named = as_os_error(e, path)
        if named is None or named is e:
            raise
        raise named from e


def temporary_name(path: str | os.PathLike) -> Path:
    """A hidden name beside ``path`` for its content in progress (unique per process and call)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open ``path`` for writing such that it appears complete or not at all (see the module docstring).

    The content is fsynced before the rename; an existing file's permission bits are kept. Any
    exception inside the block removes the temporary file and leaves ``path`` as it was.
    """
    path = Path(path)
    with naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_name(path)
        f = open(tmp, mode, encoding=None if "b" in mode else encoding)
    try:
        with naming(path):
            yield f
            f.flush()
            os.fsync(f.fileno())
            f.close()
            if path.exists():
                shutil.copymode(path, tmp)
            os.replace(tmp, path)
    except BaseException:
        try:
            f.close()
        except OSError:  # the failed flush again: the temporary file goes anyway
            pass
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """``Path.write_text`` through :func:`atomic_write`."""
    with atomic_write(path) as f:
        f.write(text)


__all__ = ["as_os_error", "atomic_write", "naming", "temporary_name", "write_text_atomic"]


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file, read in 1 MiB blocks: checkpoints, packaged models and corpora pin files by it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

