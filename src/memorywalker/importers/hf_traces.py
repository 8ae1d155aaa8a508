"""A local copy of a Hugging Face Hub *agent traces* dataset → trajectories, each file (or group of rows)
imported by the importer of the harness that wrote it.

The Hub detects the raw session files of Claude Code, Codex and Pi ("Agent Traces",
huggingface.co/docs/hub/agent-traces) and shows them as traces; a copy of such a dataset is either

* **the files** (``hf download --repo-type dataset NAME --local-dir DIR``): every ``*.jsonl`` under the
  folder is recognized from its first records - a Pi header (``type: session`` with ``cwd`` /
  ``version``), Codex rollout items (``session_meta`` / ``response_item`` / ``turn_context`` with a
  ``payload``), Claude Code records (``user`` / ``assistant`` / ``system`` / ``summary`` … with a
  ``uuid`` or ``sessionId``) - and handed to that importer (Claude Code subagent files with their
  session); or
* **rows**: a Parquet file (the Hub's conversion, or ``datasets`` ``to_parquet``) or an SQLite database
  (one table) whose rows are the records of those files, one record per row, columns = record fields
  (nested fields as structs or as JSON text; the nulls that a shared schema adds are dropped). Rows are
  grouped by a file column when there is one (``file``, ``filename``, ``path``, ``source_file``,
  ``__file__``), else into sessions in row order (a Pi header or Codex ``session_meta`` opens one;
  Claude Code records group by ``sessionId``). Each group is imported as one session file.

Anything else (Hermes Agent or Factory Droid exports, the Hub's STS format) is not recognized here: see
docs/importers.md for what is and is not pinned down about them.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from memorywalker.errors import InputError
from memorywalker.importers import claude_code, codex, pi
from memorywalker.importers.base import ImportOptions, ImportResult, loads_deep_limited
from memorywalker.importers.claude_code.records import NOT_SENT as CLAUDE_NOT_SENT
from memorywalker.records import RecordError
from memorywalker.records.limits import RecordLimits, check_depth, loads

FORMAT = "hf-traces"
HARNESSES: dict[str, Callable[[list[Path], ImportOptions], ImportResult]] = {
    "claude-code": claude_code.import_paths, "codex": codex.import_paths, "pi": pi.import_paths}
_CODEX = {"session_meta", "response_item", "turn_context", "compacted", "event_msg", "world_state"}
_CLAUDE = {"user", "assistant", "system", "summary", "attachment", "progress", "file-history-snapshot"}
_FILE_COLUMNS = ("__file__", "file", "filename", "path", "source_file", "session_file")
_NESTED = {"message", "payload", "attachment", "toolUseResult", "compactMetadata", "microcompactMetadata",
           "snapshot", "usage", "details", "arguments", "info"}


def detect(records: Iterable[dict]) -> str | None:
    """The harness whose session file these records (the first ones of a file) come from."""
    records = [r for r in records if isinstance(r, dict)]
    if not records:
        return None
    first = records[0]
    if first.get("type") == "session" and ("cwd" in first or "version" in first) and "harness" not in first:
        return "pi"
    kinds = [(r.get("type") if isinstance(r.get("type"), str) else None, r) for r in records]
    if any(k in _CODEX and isinstance(r.get("payload"), dict) for k, r in kinds):
        return "codex"
    if any(k in _CLAUDE and ("uuid" in r or "sessionId" in r) for k, r in kinds):
        return "claude-code"
    return None


def _head(path: Path, n: int = 50) -> list[dict]:
    """The first ``n`` good records of a file, to recognize it (bad, oversized or too deeply nested lines
    are passed over here; the harness importer rejects them with their reasons)."""
    out = []
    limits = RecordLimits.from_env()
    try:
        with open(path, "rb") as f:
            for raw in f:
                if len(out) >= n:
                    break
                try:
                    obj = loads(raw, limits)
                except (UnicodeDecodeError, json.JSONDecodeError, RecordError):
                    continue
                if isinstance(obj, dict):
                    out.append(obj)
    except OSError:
        return []
    return out


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    options = options or ImportOptions()
    result = ImportResult()
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        by_harness: dict[str, list[Path]] = {}
        for f in files:
            if f.suffix == ".parquet" or f.suffix in (".sqlite", ".sqlite3", ".db"):
                result.add(import_rows(f, options))
                continue
            if f.suffix != ".jsonl":
                continue
            harness = detect(_head(f))
            if harness == "claude-code" and f.parent.name == "subagents" and f.parent.parent.with_suffix(".jsonl").exists():
                continue  # imported with its session file
            if harness is None:
                result.reject(f, None, "bad_format", f"{f.name}: not a session file of a harness the Hub recognizes "
                              "(Claude Code, Codex, Pi)")
                continue
            by_harness.setdefault(harness, []).append(f)
        for harness, group in by_harness.items():
            result.add(HARNESSES[harness](group, options))
            result.notes[f"files:{harness}"] += len(group)
    return result


def _clean(x: Any, key: str | None = None) -> Any:
    """A row value as the record field it was: nulls of the shared schema dropped, JSON text of nested
    fields parsed (depth-limited: a :class:`RecordError` ``too_deep`` for hostile nesting)."""
    if isinstance(x, dict):
        return {k: _clean(v, k) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_clean(v) for v in x if v is not None]
    if isinstance(x, str) and key in _NESTED and x[:1] in "{[":
        try:
            return _clean(loads_deep_limited(x))
        except json.JSONDecodeError:
            return x
    return x


def _rows(path: Path) -> Iterable[dict]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # lazy: optional dependency (the parquet extra)
        except ImportError as e:  # an optional dependency: the `parquet` extra
            raise InputError(f"{path}: reading Parquet needs pyarrow (pip install 'memorywalker[parquet]')") from e
        import pyarrow as pa  # lazy: optional dependency, present once pq imported

        try:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                yield from batch.to_pylist()
        except pa.ArrowException as e:
            raise InputError(f"not a readable Parquet file ({e})") from e
        return
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("select name from sqlite_master where type = 'table' order by name")]
        con.row_factory = sqlite3.Row
        for table in tables:
            for row in con.execute(f'select * from "{table}"'):
                yield dict(row)
    finally:
        con.close()


def _groups(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """Rows → (name, records of one session file): by the file column, else in row order - a Pi header or
    Codex ``session_meta`` opens a group that the following non-Claude rows join; Claude Code rows join
    the group of their ``sessionId`` (rows without one, that of the row before)."""
    column = next((c for c in _FILE_COLUMNS if rows and all(c in r for r in rows)), None)
    out: list[tuple[str, list[dict]]] = []
    if column:
        named: dict[str, list[dict]] = {}
        for r in rows:
            key = str(r[column])
            if key not in named:
                named[key] = []
                out.append((key, named[key]))
            named[key].append({k: v for k, v in r.items() if k != column})
        return out
    current: list[dict] | None = None
    claude: dict[str, list[dict]] = {}
    last_sid = "session"
    for r in rows:
        kind = r.get("type")
        if kind in _CLAUDE or kind in CLAUDE_NOT_SENT:
            last_sid = r["sessionId"] if isinstance(r.get("sessionId"), str) else last_sid
            if last_sid not in claude:
                claude[last_sid] = []
                out.append((last_sid, claude[last_sid]))
            claude[last_sid].append(r)
            continue
        if kind in ("session", "session_meta") or current is None:
            head = r.get("payload") if kind == "session_meta" and isinstance(r.get("payload"), dict) else r
            current = []
            out.append((str(head.get("id") or f"rows-{len(out)}"), current))
        current.append(r)
    return out


def import_rows(path: Path, options: ImportOptions) -> ImportResult:
    """A Parquet file or SQLite database of trace records: each group of rows as one session file."""
    result = ImportResult()
    limits = RecordLimits.from_env()
    rows = []
    try:
        for i, r in enumerate(_rows(path), 1):
            try:
                check_depth(r, limits)  # before the recursive _clean and json.dumps
                rows.append(_clean(r))
            except RecordError as e:  # this row only; the rows around it are kept
                result.read += 1
                result.reject(path, i, e.code, f"row {i}: {e.message}")
    except (OSError, sqlite3.Error, ValueError) as e:
        result.reject(path, None, "unreadable_file", f"{path.name}: {e}")
        return result
    kinds: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for n, (name, group) in enumerate(_groups(rows)):
            harness = detect(group[:50])
            if harness is None:
                result.reject(path, None, "bad_format", f"{path.name}: rows of group {name!r} are not records of a "
                              "harness the Hub recognizes (Claude Code, Codex, Pi)")
                continue
            f = Path(tmp) / f"{n:05d}-{Path(name).stem or 'session'}.jsonl"
            f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in group), encoding="utf-8")
            part = HARNESSES[harness]([f], options)
            for t in part.trajectories:  # name the rows, not the temporary file
                t.lineage.source_path = f"{path}#{name}"
            part.rejects = [r.__class__(f"{path}#{name}", r.line, r.reason, r.message, r.kept, r.detail)
                            for r in part.rejects]
            result.add(part)
            kinds[harness] += 1
    result.notes.update({f"row_groups:{k}": v for k, v in kinds.items()})
    return result
