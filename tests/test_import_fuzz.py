"""Every importer on mutated inputs: a valid sample of its format, then seeded random mutations - a field
deleted, a value replaced by one of another type, a record dropped or repeated, the file cut at a random
byte. No mutation may crash an importer; every result keeps ``read = imported + skipped + rejected`` and
every trajectory it returns passes ``check_trajectory``. Cheap: small inputs, 30 mutations per format."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from memorywalker.importers import IMPORTERS, ImportOptions, cline, get_importer, roo_code
from memorywalker.records import check_trajectory
from test_import_claude_code import _mixed_session
from test_import_gemini_cli import _fr, _gem, _msg
from test_import_newer_formats import _V13_SCHEMA, _oc_session, _openhands_parallel_and_reused
from test_import_pi import _v3_session
from test_import_synthetic import _codex_rollout
from test_import_vscode_agents import _cline_history, _roo_truncated

N_MUTATIONS = 30
MINI = Path(__file__).resolve().parent / "data" / "mini-swe-agent" / "tools" / "traj.json"  # mini-swe-agent 2.4's own
ODD_VALUES = [None, 0, -1, 1.5e308, "", "x", [], {}, [None], {"a": None}, True]


def _samples() -> dict[str, tuple[str, object]]:
    """format -> (file name, a valid input: a list of JSONL records or one JSON document)."""
    gemini = [{"sessionId": "g", "projectHash": "h"}, _msg("u1", "user", "hi"), _gem("g1", "", 100, calls=["c1"]),
              _fr("r1", "c1", "ok"), _msg("i1", "info", "Context compressed from 70% to 20%."),
              _gem("g2", "done", 50), {"$rewindTo": "g2"}, _gem("g3", "again", 60)]
    qwen = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "function", "name": "f", "content": "r"}, {"role": "assistant", "content": "a"}]
    chat = [{"request": {"messages": [{"role": "user", "content": "x"}]},
             "response": {"choices": [{"message": {"role": "assistant", "content": "y", "tool_calls": [
                 {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}]}},
            {"request": {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                                      {"role": "tool", "tool_call_id": "c", "content": "z"}]},
             "response": {"choices": [{"message": {"role": "assistant", "content": "w"}}]}}]
    traj = {"trajectory": [{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                         {"role": "assistant", "content": "a"}]},
                           {"query": [{"role": "user", "content": "u"}], "response": "b"}], "info": {}}
    return {
        "claude-code": ("s1.jsonl", _mixed_session()),
        "codex": ("rollout.jsonl", _codex_rollout(replacement=True)),
        "opencode": ("export.json", {"info": {"id": "ses_3"}, "messages": _oc_session(tail=True)}),
        "openhands": ("events.json", _openhands_parallel_and_reused()),
        "swe-agent": ("t.traj", traj),
        "qwen-agent": ("q.json", qwen),
        "openai-chat": ("log.jsonl", chat),
        "pi": ("s.jsonl", _v3_session()),
        "cline": ("api_conversation_history.json", _cline_history()),
        "roo-code": ("api_conversation_history.json", _roo_truncated()),
        "gemini-cli": ("session-1.jsonl", gemini),
        "hf-traces": ("d.jsonl", _v3_session()),
        "mini-swe-agent": ("t.traj.json", json.loads(MINI.read_text())),
    }


def _spots(x, out, depth=0):
    """Every (container, key) of a JSON structure."""
    if depth > 12:
        return out
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else []
    for k, v in items:
        out.append((x, k))
        _spots(v, out, depth + 1)
    return out


def _mutate(doc, rng: random.Random):
    doc = json.loads(json.dumps(doc))
    spots = _spots(doc, [])
    if not spots:
        return doc
    container, key = rng.choice(spots)
    op = rng.random()
    if op < 0.35:
        del container[key]
    elif op < 0.8:
        container[key] = rng.choice(ODD_VALUES)
    elif isinstance(container, list):
        container.insert(key, json.loads(json.dumps(container[key])))  # a repeated record / item
    else:
        container[key] = [container[key]]
    return doc


def _write(path: Path, doc) -> None:
    if path.suffix == ".jsonl":
        rows = doc if isinstance(doc, list) else [doc]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text(json.dumps(doc))


@pytest.mark.parametrize("fmt", sorted(IMPORTERS))
def test_fuzz_importer(tmp_path, fmt):
    name, doc = _samples()[fmt]
    rng = random.Random(f"memorywalker-fuzz-{fmt}")
    for n in range(N_MUTATIONS):
        case = tmp_path / f"case{n}"
        case.mkdir()
        path = case / name
        mutated = _mutate(doc, rng)
        for _ in range(rng.randrange(3)):  # sometimes several mutations at once
            mutated = _mutate(mutated, rng)
        _write(path, mutated)
        if n % 5 == 4:  # and sometimes the file cut at a random byte
            data = path.read_bytes()
            path.write_bytes(data[: rng.randrange(len(data))])
        result = get_importer(fmt)([path], ImportOptions())
        assert result.read == result.imported + sum(result.skipped.values()) + result.rejected, (fmt, n)
        for t in result.trajectories:
            check_trajectory(t)
        assert all(r.reason and r.message for r in result.rejects)


def test_every_format_has_a_fuzz_sample():
    assert set(_samples()) == set(IMPORTERS)


# --- hostile nesting: the bounded parser (records.limits) in every importer -------------------------

def _nested(levels: int) -> list:
    x: list = []
    for _ in range(levels - 1):
        x = [x]
    return x


DEEP_LINE = "[" * 5000 + "]" * 5000  # deeper than json's own recursion limit: RecursionError unbounded


def _shape(result) -> list[int]:
    return sorted(len(t.calls) for t in result.trajectories)


@pytest.mark.parametrize("fmt", sorted(IMPORTERS))
def test_hostile_nesting_is_rejected_too_deep(tmp_path, fmt):
    """The format's valid sample with hostile nesting added. JSONL inputs: one line nesting 5,000
    levels and one record nesting 150 (under json's recursion limit, over max_depth 100) after the
    first record - each rejected ``too_deep`` with its line, the trajectories and their calls as
    without them. JSON documents: the same nesting inside the document (5,000 levels as text, 150 as
    a value) - the file rejected ``too_deep``, nothing else. No RecursionError; counts add up."""
    name, doc = _samples()[fmt]
    clean = tmp_path / "clean" / name
    clean.parent.mkdir()
    _write(clean, doc)
    base = get_importer(fmt)([clean], ImportOptions())
    if name.endswith(".jsonl"):
        path = tmp_path / "hostile" / name
        path.parent.mkdir()
        lines = clean.read_text().splitlines()
        hostile = [lines[0], DEEP_LINE, json.dumps({"type": "user", "x": _nested(150)}), *lines[1:]]
        path.write_text("\n".join(hostile) + "\n")
        result = get_importer(fmt)([path], ImportOptions())
        deep = [(r.line, r.reason) for r in result.rejects if r.reason == "too_deep"]
        assert deep == [(2, "too_deep"), (3, "too_deep")], result.rejects
        assert sorted(r.reason for r in result.rejects if r.reason != "too_deep") == sorted(r.reason for r in base.rejects)
        assert _shape(result) == _shape(base) and result.imported == base.imported
        assert result.read == base.read + 2
        assert result.read == result.imported + sum(result.skipped.values()) + result.rejected
    else:
        for levels, n in ((5000, "deep"), (150, "mid")):
            path = tmp_path / n / name
            path.parent.mkdir()
            marker = "__HOSTILE__"
            text = json.dumps({**doc, "x": marker} if isinstance(doc, dict) else [*doc, {"x": marker}])
            path.write_text(text.replace(f'"{marker}"', json.dumps(_nested(levels)) if levels < 900 else DEEP_LINE))
            result = get_importer(fmt)([path], ImportOptions())
            assert [(r.line, r.reason) for r in result.rejects] == [(None, "too_deep")], (n, result.rejects)
            assert result.trajectories == []
            assert result.read == result.imported + sum(result.skipped.values()) + result.rejected


def test_billed_info_nested_too_deep_leaves_the_call_unchecked(tmp_path):
    """Cline and Roo Code keep each request's billed tokens as JSON text inside ui_messages.json
    (``api_req_started``). Text nesting 5,000 levels there, or JSON that is not an object, is no billed
    evidence: the call is imported and ``unchecked``, nothing is rejected for it."""
    slots = cline._ui_requests([{"conversationHistoryIndex": 0, "say": "api_req_started", "ts": 1, "text": DEEP_LINE},
                                {"conversationHistoryIndex": 2, "say": "api_req_started", "ts": 2, "text": "[1]"}])
    assert slots == {0: {"ts": 1, "info": {}}, 2: {"ts": 2, "info": {}}}
    task = tmp_path / "tasks" / "t1"
    task.mkdir(parents=True)
    (task / "api_conversation_history.json").write_text(json.dumps([
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "ts": 1},
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}], "ts": 10}]))
    (task / "ui_messages.json").write_text(json.dumps([{"ts": 5, "type": "say", "say": "api_req_started",
                                                         "text": DEEP_LINE}]))
    result = roo_code.import_paths([tmp_path / "tasks"], ImportOptions())
    (traj,) = result.trajectories
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked"] and result.rejects == []
    assert result.read == result.imported + sum(result.skipped.values()) + result.rejected


def test_hostile_nesting_in_rows_and_database_rows(tmp_path):
    """Rows (hf-traces SQLite) and OpenCode database rows hold nested fields as JSON text: a row whose
    text nests 5,000 levels is rejected ``too_deep`` with its row number, the rows around it are
    imported (hf-traces: the Pi session of the fuzz sample, one row per record; OpenCode 1.3: the
    message whose data it is)."""
    rows = _v3_session()
    db = tmp_path / "traces.sqlite"
    con = sqlite3.connect(db)
    keys = sorted({k for r in rows for k in r})
    con.execute(f"create table rows ({', '.join(json.dumps(k) for k in keys)})")
    values = [[json.dumps(r[k]) if isinstance(r.get(k), dict | list) else r.get(k) for k in keys] for r in rows]
    deep = list(values[1])
    deep[keys.index("message") if "message" in keys else keys.index("details")] = DEEP_LINE
    con.executemany(f"insert into rows values ({', '.join('?' * len(keys))})", [values[0], deep, *values[1:]])
    con.commit()
    con.close()
    direct = tmp_path / "s.jsonl"
    direct.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = get_importer("hf-traces")([db], ImportOptions())
    assert [(r.line, r.reason) for r in result.rejects if r.reason == "too_deep"] == [(2, "too_deep")]
    assert _shape(result) == _shape(get_importer("pi")([direct], ImportOptions()))
    assert result.read == result.imported + sum(result.skipped.values()) + result.rejected
    # OpenCode 1.3: the second message's row data nests 5,000 levels; that message alone is rejected.
    oc = tmp_path / "opencode.db"
    con = sqlite3.connect(oc)
    con.executescript(_V13_SCHEMA)
    con.execute("insert into session (id, project_id, slug, directory, title, version, time_created, time_updated) "
                "values ('ses_3', 'p', 's', '/w', 'three', '1.3.4', 1, 2)")
    for n, m in enumerate(_oc_session(tail=False)):
        data = json.dumps({k: v for k, v in m["info"].items() if k not in ("id", "sessionID")})
        con.execute("insert into message values (?, 'ses_3', ?, ?, ?)", (m["info"]["id"], n, n, DEEP_LINE if n == 1 else data))
        for p in m["parts"]:
            pdata = {k: v for k, v in p.items() if k not in ("id", "messageID", "sessionID")}
            con.execute("insert into part values (?, ?, 'ses_3', ?, ?, ?)", (p["id"], m["info"]["id"], n, n, json.dumps(pdata)))
    con.commit()
    con.close()
    result = get_importer("opencode")([oc], ImportOptions())
    assert [(r.line, r.reason) for r in result.rejects if r.reason == "too_deep"] == [(1, "too_deep")]
    # 9 messages: read 9 = imported 7 + skipped 1 (the one without parts, as OpenCode skips it) + rejected 1
    assert (result.read, result.imported, dict(result.skipped), result.rejected) == (9, 7, {"message_without_parts": 1}, 1)
    assert len(result.trajectories) == 1
