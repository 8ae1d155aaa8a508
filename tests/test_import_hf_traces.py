"""A local copy of a Hub agent-traces dataset: a folder of session files (each recognized and imported by
its harness's importer) and the same records as rows of a Parquet file or an SQLite table
(huggingface.co/docs/hub/agent-traces: Claude Code, Codex and Pi sessions are detected as traces)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from memorywalker.importers import run_import
from memorywalker.importers.hf_traces import detect
from test_import_pi import _v3_session
from test_import_synthetic import _codex_rollout

NESTED = ("message", "payload", "attachment", "toolUseResult", "compactMetadata", "microcompactMetadata", "usage")


def _dataset(tmp: Path, harness_logs: Path) -> Path:
    root = tmp / "dataset"
    (root / "sessions" / "claude_code").mkdir(parents=True)
    (root / "sessions" / "codex").mkdir()
    (root / "sessions" / "pi").mkdir()
    shutil.copy(harness_logs / "claude-code" / "tool_heavy.jsonl", root / "sessions" / "claude_code")
    (root / "sessions" / "codex" / "rollout-1.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in _codex_rollout(replacement=True)))
    (root / "sessions" / "pi" / "s1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _v3_session()))
    (root / "notes.jsonl").write_text(json.dumps({"kind": "a note"}) + "\n")
    (root / "README.md").write_text("# traces\n")
    return root


def _contexts(trajectories) -> dict[str, list]:
    return {t.id: [(c.context, c.response, c.selected) for c in t.calls] for t in trajectories}


def test_detect_by_first_records():
    assert detect(_v3_session()[:3]) == "pi"
    assert detect(_codex_rollout(True)[:3]) == "codex"
    assert detect([{"type": "user", "uuid": "u", "sessionId": "s", "message": {}}]) == "claude-code"
    assert detect([{"type": "session", "harness": "llama.app", "id": "x"}]) is None


def test_folder_of_session_files(tmp_path, harness_logs):
    """Each file goes to its harness's importer: the same trajectories as importing them one by one;
    the file that is no known trace is one bad_format reject; README.md is not a session file."""
    root = _dataset(tmp_path, harness_logs)
    res = run_import("hf-traces", [root])
    direct = [*run_import("claude-code", [root / "sessions" / "claude_code" / "tool_heavy.jsonl"]).trajectories,
              *run_import("codex", [root / "sessions" / "codex" / "rollout-1.jsonl"]).trajectories,
              *run_import("pi", [root / "sessions" / "pi" / "s1.jsonl"]).trajectories]
    assert _contexts(res.trajectories) == _contexts(direct)
    assert [r.reason for r in res.rejects] == ["bad_format"] and "notes.jsonl" in res.rejects[0].source
    assert res.notes["files:claude-code"] == res.notes["files:codex"] == res.notes["files:pi"] == 1
    assert res.read == res.imported + sum(res.skipped.values()) + res.rejected


def _rows(root: Path) -> list[dict]:
    """The records as rows of a shared table: a file column, nested fields as JSON text, the other
    fields as they are, missing ones null (as one schema for every file makes them)."""
    records = [(str(p.relative_to(root)), json.loads(line)) for p in sorted(root.rglob("*.jsonl"))
               for line in p.read_text().splitlines() if line.strip() and p.name != "notes.jsonl"]
    keys = sorted({k for _, r in records for k in r})
    return [{"file": f, **{k: (json.dumps(r[k]) if k in NESTED and k in r else
                              r.get(k) if not isinstance(r.get(k), dict | list) else json.dumps(r[k])) for k in keys}}
            for f, r in records]


@pytest.mark.parametrize("kind", ["parquet", "sqlite"])
def test_rows_export(tmp_path, harness_logs, kind):
    """The same records as rows (Parquet via pyarrow, or one SQLite table): grouped by the file column,
    each group imported as its file - the contexts equal the folder import's."""
    root = _dataset(tmp_path, harness_logs)
    rows = _rows(root)
    if kind == "parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        path = tmp_path / "train-00000-of-00001.parquet"
        cols = {k: [r[k] for r in rows] for k in rows[0]}
        # one type per column: int / bool columns stay so where every value is one, else text
        pq.write_table(pa.table({k: pa.array(vals if all(v is None or type(v) is int for v in vals)
                                             or all(v is None or type(v) is bool for v in vals) else
                                             [None if v is None else str(v) for v in vals]) for k, vals in cols.items()}),
                       path)
    else:
        path = tmp_path / "traces.sqlite"
        con = sqlite3.connect(path)
        con.execute(f"create table rows ({', '.join(f'{json.dumps(k)}' for k in rows[0])})")
        con.executemany(f"insert into rows values ({', '.join('?' * len(rows[0]))})",
                        [[v if not isinstance(v, bool) else int(v) for v in r.values()] for r in rows])
        con.commit()
        con.close()
    res = run_import("hf-traces", [path])
    folder = run_import("hf-traces", [root])
    assert _contexts(res.trajectories) == _contexts(folder.trajectories)
    assert {t.lineage.source_path.split("#")[1] for t in res.trajectories if t.lineage.parent is None} == {
        "sessions/claude_code/tool_heavy.jsonl", "sessions/codex/rollout-1.jsonl", "sessions/pi/s1.jsonl"}
    assert res.read == res.imported + sum(res.skipped.values()) + res.rejected


def test_unreadable_rows_file(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"not parquet at all")
    res = run_import("hf-traces", [bad])
    assert [r.reason for r in res.rejects] == ["unreadable_file"] and res.trajectories == []
