"""Every importer on mutated inputs: a valid sample of its format, then seeded random mutations - a field
deleted, a value replaced by one of another type, a record dropped or repeated, the file cut at a random
byte. No mutation may crash an importer; every result keeps ``read = imported + skipped + rejected`` and
every trajectory it returns passes ``check_trajectory``. Cheap: small inputs, 30 mutations per format."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from memorywalker.importers import IMPORTERS, ImportOptions, get_importer
from memorywalker.records import check_trajectory
from test_import_claude_code import _mixed_session
from test_import_gemini_cli import _fr, _gem, _msg
from test_import_newer_formats import _oc_session, _openhands_parallel_and_reused
from test_import_pi import _v3_session
from test_import_synthetic import _codex_rollout
from test_import_vscode_agents import _cline_history, _roo_truncated

N_MUTATIONS = 30
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
