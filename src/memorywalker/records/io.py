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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

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


def parse_line(raw: bytes, *, final: bool, vocab_size: int | None = None) -> Trajectory:
    """Parse and check one JSONL line; raise :class:`RecordError` with its reason code."""
    if not raw.strip():
        raise RecordError("empty_line", "blank line")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError("non_utf8", f"byte {e.start}: {e.reason}") from None
    try:
        obj = json.loads(text)
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


class TrajectoryReader:
    """Iterate the valid trajectories of one or more JSONL files; reject the rest with reasons.

    Rejects are streamed to ``rejects_path`` (if given) as ``{"source", "line", "reason", "message",
    "raw"}`` objects. Without a rejects file only the first ``keep_rejects`` are kept in ``rejects``
    (for display): memory stays constant however many lines are rejected; ``summary`` counts them all.
    Trajectory ids must be unique across everything one reader reads.
    """

    def __init__(
        self,
        paths: str | os.PathLike | Iterable[str | os.PathLike],
        *,
        rejects_path: str | os.PathLike | None = None,
        vocab_size: int | None = None,
        keep_rejects: int = 20,
    ):
        self.paths = [Path(paths)] if isinstance(paths, str | os.PathLike) else [Path(p) for p in paths]
        self.rejects_path = Path(rejects_path) if rejects_path else None
        self.vocab_size = vocab_size
        self.summary = ReadSummary()
        self.rejects: list[Reject] = []  # the first keep_rejects, only when no rejects file is given
        self.keep_rejects = keep_rejects
        self._seen_ids: set[str] = set()

    def __iter__(self) -> Iterator[Trajectory]:
        rejects_file = open(self.rejects_path, "w", encoding="utf-8") if self.rejects_path else None
        try:
            for path in self.paths:
                yield from self._read_one(path, rejects_file)
        finally:
            if rejects_file:
                rejects_file.close()

    def _read_one(self, path: Path, rejects_file: IO[str] | None) -> Iterator[Trajectory]:
        with open(path, "rb") as f:
            lineno = 0
            line = f.readline()
            while line:
                nxt = f.readline()
                lineno += 1
                self.summary.read += 1
                try:
                    traj = parse_line(line, final=not nxt, vocab_size=self.vocab_size)
                    if traj.id in self._seen_ids:
                        raise RecordError("duplicate_trajectory_id", f"trajectory id {traj.id!r} seen before")
                except RecordError as e:
                    self._reject(Reject(lineno, e.code, e.message, line.decode("utf-8", "replace").rstrip("\n"),
                                        str(path)), rejects_file)
                else:
                    self._seen_ids.add(traj.id)
                    self.summary.accepted += 1
                    yield traj
                line = nxt

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
    """Append trajectories to a JSONL file, one compact line each, flushed per record.

    Opening with ``mode="a"`` makes runs resumable: a record is either fully written or, if the
    process died mid-write, a truncated final line that the reader rejects as ``truncated_line``.
    """

    def __init__(self, path: str | os.PathLike, mode: str = "w"):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, mode, encoding="utf-8")

    def write(self, traj: Trajectory | dict) -> None:
        obj = traj.to_json_dict() if isinstance(traj, Trajectory) else traj
        self._f.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_trajectories(path: str | os.PathLike, trajs: Iterable[Trajectory | dict]) -> int:
    n = 0
    with TrajectoryWriter(path) as w:
        for t in trajs:
            w.write(t)
            n += 1
    return n


__all__ = [
    "REASONS",
    "ReadSummary",
    "RecordError",
    "Reject",
    "TrajectoryReader",
    "TrajectoryWriter",
    "parse_line",
    "read_trajectories",
    "write_trajectories",
]
