"""Streaming JSONL I/O for trajectory records, in constant memory in the number of records.

>>> reader = TrajectoryReader("episodes.jsonl", rejects_path="rejects.jsonl")  # doctest: +SKIP
>>> for traj in reader:                                                       # doctest: +SKIP
...     ...
>>> reader.summary  # doctest: +SKIP
ReadSummary(read=10, accepted=9, rejected=1, by_reason={'bad_json': 1})

Every line is either accepted (yielded) or rejected with a reason code from
:data:`~memorywalker.records.validate.REASONS`; rejects keep the original line. ``read`` always
equals ``accepted + rejected``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from memorywalker.fileio import atomic_write, naming
from memorywalker.records.limits import RecordLimits, check_size, loads
from memorywalker.records.schema import SCHEMA_VERSION, Trajectory
from memorywalker.records.validate import (
    REASONS,
    RecordError,
    Reject,
    check_trajectory,
    from_validation_error,
)


@dataclass
class ReadSummary:
    read: int = 0
    accepted: int = 0
    rejected: int = 0
    by_reason: Counter = field(default_factory=Counter)

    def add(self, other: ReadSummary) -> None:
        self.read += other.read
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.by_reason.update(other.by_reason)

    def as_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "by_reason": dict(sorted(self.by_reason.items())),
        }

    def __str__(self) -> str:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.by_reason.items()))
        return f"read {self.read} = accepted {self.accepted} + rejected {self.rejected}" + (
            f" ({reasons})" if reasons else ""
        )


def parse_line(raw: bytes, *, final: bool, vocab_size: int | None = None,
               limits: RecordLimits | None = None) -> Trajectory:
    """Parse and check one JSONL line; raise :class:`RecordError` with its reason code.

    ``limits`` bound the line's size and nesting depth (:mod:`memorywalker.records.limits`; default:
    from the environment) before pydantic or any recursive walk sees it."""
    limits = limits or RecordLimits.from_env()
    if not raw.strip():
        raise RecordError("empty_line", "blank line")
    check_size(len(raw.rstrip(b"\n")), limits)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError("non_utf8", f"byte {e.start}: {e.reason}") from None
    try:
        obj = loads(text.rstrip("\n"), limits)
    except json.JSONDecodeError as e:
        if final and not raw.endswith(b"\n"):
            raise RecordError("truncated_line", f"unterminated last line ({e.msg} at char {e.pos})") from None
        raise RecordError("bad_json", f"{e.msg} at char {e.pos}") from None
    if not isinstance(obj, dict):
        raise RecordError("not_an_object", f"got a JSON {type(obj).__name__}")
    if obj.get("schema") != SCHEMA_VERSION:
        raise RecordError("schema_version", f"schema is {obj.get('schema')!r}, expected {SCHEMA_VERSION!r}")
    try:
        traj = Trajectory.model_validate(obj)
    except ValidationError as e:
        raise from_validation_error(e) from None
    check_trajectory(traj, vocab_size=vocab_size)
    return traj


# A rejected line longer than this keeps only its head in the rejects file (the message says how long it was).
_RAW_KEPT = 4096


def _bounded_lines(f: IO[bytes], max_bytes: int) -> Iterator[tuple[bytes, int]]:
    """``(line, size)`` per line of ``f``; a line longer than ``max_bytes`` is not held: only its first
    ``max_bytes + 1`` bytes are returned (the rest is skipped up to its newline), with its full size."""
    while True:
        line = f.readline(max_bytes + 1)
        if not line:
            return
        size, ended = len(line), line.endswith(b"\n")
        if size > max_bytes and not ended:
            while True:
                rest = f.readline(1 << 20)
                size += len(rest)
                if not rest or rest.endswith(b"\n"):
                    ended = bool(rest)
                    break
            line = line[:_RAW_KEPT]
        yield line, size - ended


Check = Callable[[Trajectory], None]


class TrajectoryReader:
    """Iterate the valid trajectories of one or more JSONL files; reject the rest with reasons.

    Rejects go to ``rejects_path`` (if given) as ``{"source", "line", "reason", "message", "raw"}``
    objects, written to a temporary file renamed into place when the reading ends (a reader never
    sees half a rejects file; a failed read leaves the previous one). Without a rejects file only
    the first ``keep_rejects`` are kept in ``rejects`` (for display): memory stays constant however
    many lines are rejected; ``summary`` counts them all. Trajectory ids must be unique across
    everything one reader reads.

    ``vocab_size`` rejects recorded token ids the tokenizer does not have (every reader that feeds
    a model passes it); ``limits`` bound each line's size and depth; ``check`` is one more test of
    each parsed trajectory (e.g. that it fits the model's positions), raising :class:`RecordError`.
    :meth:`of` puts trajectories already in memory through the same checks.
    """

    def __init__(
        self,
        paths: str | os.PathLike | Iterable[str | os.PathLike],
        *,
        rejects_path: str | os.PathLike | None = None,
        vocab_size: int | None = None,
        keep_rejects: int = 20,
        limits: RecordLimits | None = None,
        check: Check | None = None,
    ):
        self.paths = [Path(paths)] if isinstance(paths, str | os.PathLike) else [Path(p) for p in paths]
        self.rejects_path = Path(rejects_path) if rejects_path else None
        self.vocab_size = vocab_size
        self.limits = limits or RecordLimits.from_env()
        self.check = check
        self.summary = ReadSummary()
        self.rejects: list[Reject] = []  # the first keep_rejects, only when no rejects file is given
        self.keep_rejects = keep_rejects
        self._seen_ids: set[str] = set()
        self._objects: list[Trajectory] | None = None

    @classmethod
    def of(cls, trajectories: Iterable[Trajectory], **kwargs) -> TrajectoryReader:
        """A reader over trajectories already in memory (source ``<memory>``, line = 1-based index)."""
        reader = cls([], **kwargs)
        reader._objects = list(trajectories)
        return reader

    def __iter__(self) -> Iterator[Trajectory]:
        if self.rejects_path is None:
            yield from self._read_all(None)
            return
        with atomic_write(self.rejects_path) as rejects_file:
            try:
                yield from self._read_all(rejects_file)
            except GeneratorExit:  # the consumer stopped early: the rejects of the lines read are complete
                return

    def _read_all(self, rejects_file: IO[str] | None) -> Iterator[Trajectory]:
        if self._objects is not None:
            yield from self._screen(self._objects, rejects_file)
        for path in self.paths:
            yield from self._read_one(path, rejects_file)

    def _read_one(self, path: Path, rejects_file: IO[str] | None) -> Iterator[Trajectory]:
        with open(path, "rb") as f:
            lines = _bounded_lines(f, self.limits.max_bytes)
            lineno = 0
            item = next(lines, None)
            while item is not None:
                nxt = next(lines, None)
                line, size = item
                lineno += 1
                self.summary.read += 1
                try:
                    check_size(size, self.limits)
                    traj = parse_line(line, final=nxt is None, vocab_size=self.vocab_size, limits=self.limits)
                    self._accept(traj)
                except RecordError as e:
                    raw = line.decode("utf-8", "replace").rstrip("\n")
                    if size > len(line):
                        raw += f"... [cut: the line has {size:,} bytes]"
                    self._reject(Reject(lineno, e.code, e.message, raw, str(path)), rejects_file)
                else:
                    self.summary.accepted += 1
                    yield traj
                item = nxt

    def _screen(self, trajectories: list[Trajectory], rejects_file: IO[str] | None) -> Iterator[Trajectory]:
        for i, traj in enumerate(trajectories, 1):
            self.summary.read += 1
            try:
                check_trajectory(traj, vocab_size=self.vocab_size)
                self._accept(traj)
            except RecordError as e:
                raw = json.dumps(traj.to_json_dict(), ensure_ascii=False, separators=(",", ":"))
                self._reject(Reject(i, e.code, e.message, raw, "<memory>"), rejects_file)
            else:
                self.summary.accepted += 1
                yield traj

    def _accept(self, traj: Trajectory) -> None:
        """The checks across records and the caller's own; raise :class:`RecordError` to reject."""
        if traj.id in self._seen_ids:
            raise RecordError("duplicate_trajectory_id", f"trajectory id {traj.id!r} seen before")
        if self.check is not None:
            self.check(traj)
        self._seen_ids.add(traj.id)

    def _reject(self, reject: Reject, rejects_file: IO[str] | None) -> None:
        self.summary.rejected += 1
        self.summary.by_reason[reject.code] += 1
        if rejects_file is None:
            if len(self.rejects) < self.keep_rejects:
                self.rejects.append(reject)
            return
        rejects_file.write(json.dumps({"source": reject.source, "line": reject.line, "reason": reject.code,
                                       "message": reject.message, "raw": reject.raw}, ensure_ascii=False) + "\n")


def read_trajectories(path: str | os.PathLike, **kwargs) -> list[Trajectory]:
    """Read a whole (small) file; raise on the first reject. Convenience for tests and examples."""
    reader = TrajectoryReader(path, **kwargs)
    trajs = list(reader)
    if reader.rejects:
        r = reader.rejects[0]
        raise RecordError(r.code, f"{r.source}:{r.line}: {r.message}")
    return trajs


class TrajectoryWriter:
    """Write trajectories to a JSONL file, one compact line each.

    ``mode="a"`` appends, flushed per record, which makes runs resumable: a record is either fully
    written or, if the process died mid-write, a truncated final line that the reader rejects as
    ``truncated_line``. ``mode="w"`` writes a new file atomically: records go to a temporary file
    beside ``path`` that :meth:`close` renames into place (leaving the block on an exception
    discards it and keeps the previous file).
    """

    def __init__(self, path: str | os.PathLike, mode: str = "w"):
        if mode not in ("w", "a"):
            raise ValueError(f"mode {mode!r}: 'w' (a new file, atomically) or 'a' (append)")
        self.path = Path(path)
        self._atomic = atomic_write(self.path) if mode == "w" else None
        with naming(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = self._atomic.__enter__() if self._atomic else open(self.path, mode, encoding="utf-8")

    def write(self, traj: Trajectory | dict) -> None:
        obj = traj.to_json_dict() if isinstance(traj, Trajectory) else traj
        with naming(self.path):
            self._f.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
            if self._atomic is None:
                self._f.flush()

    def close(self, exc: BaseException | None = None) -> None:
        if self._atomic is None:
            with naming(self.path):
                self._f.close()
        elif exc is None:
            self._atomic.__exit__(None, None, None)
        else:
            self._atomic.__exit__(type(exc), exc, exc.__traceback__)

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exc)


def write_trajectories(path: str | os.PathLike, trajs: Iterable[Trajectory | dict]) -> int:
    """Write ``trajs`` to ``path`` as one complete file: a temporary file beside it, renamed into
    place when every record is written (:func:`memorywalker.fileio.atomic_write`). Returns the count."""
    n = 0
    with atomic_write(path) as f:
        for t in trajs:
            obj = t.to_json_dict() if isinstance(t, Trajectory) else t
            f.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
            n += 1
    return n


__all__ = [
    "REASONS",
    "ReadSummary",
    "RecordError",
    "RecordLimits",
    "Reject",
    "TrajectoryReader",
    "TrajectoryWriter",
    "parse_line",
    "read_trajectories",
    "write_trajectories",
]
