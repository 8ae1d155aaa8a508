"""What ``import`` writes (issue 27, failures 2 and 11): two imports racing for one output leave one of
the two complete outputs, never a mix; a tool result that answers no tool call is rejected with the
documented ``orphan_tool_result`` reason and is not counted as imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.importers import run_import
from memorywalker.records import TrajectoryReader

runner = CliRunner()


def session(folder: Path, name: str, turns: int, words: str) -> None:
    rows, parent = [], None
    for i in range(turns):
        rows.append({"type": "user", "uuid": f"{name}-u{i}", "parentUuid": parent, "sessionId": name,
                     "message": {"role": "user", "content": f"{words} {i} " * 30}})
        rows.append({"type": "assistant", "uuid": f"{name}-a{i}", "parentUuid": f"{name}-u{i}", "sessionId": name,
                     "message": {"id": f"{name}-m{i}", "role": "assistant", "content": [{"type": "text", "text": f"ok {i}"}]}})
        parent = f"{name}-a{i}"
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_two_imports_to_one_output_leave_one_complete_output(tmp_path):
    """Old code opened the output "w" in place: both imports exited 0 and `validate` found a bad_json
    fragment in 2 of 3 tries (on these inputs, run against the old code: 2 of 4 tries mixed A's and B's
    records, with bad_json at the seams). A and B are 1,000 sessions of 2 calls each, B's lines longer
    (~1.6 MB outputs); three times, two processes import them to the same file at once: the file is
    byte for byte A's output or B's, and validates whole."""
    for name, words in (("A", "a-words"), ("B", "bb-words")):
        (tmp_path / name).mkdir()
        for k in range(1000):
            session(tmp_path / name, f"{name}{k:04d}", 2, words)
    refs = set()
    for name in ("A", "B"):
        ref = tmp_path / f"ref-{name}.jsonl"
        assert runner.invoke(app, ["import", "claude-code", str(tmp_path / name), "-o", str(ref)]).exit_code == 0
        refs.add(ref.read_bytes())
    assert len(refs) == 2 and min(len(r) for r in refs) > 1_000_000
    out = tmp_path / "out.jsonl"
    for _ in range(3):
        procs = [subprocess.Popen([sys.executable, "-m", "memorywalker.cli.main", "import", "claude-code",
                                   str(tmp_path / name), "-o", str(out)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for name in ("A", "B")]
        for p in procs:
            assert p.wait(timeout=300) == 0, p.stderr.read()
        assert out.read_bytes() in refs
        reader = TrajectoryReader(out)
        assert len(list(reader)) == 1000 and reader.summary.rejected == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A", "B", "out.jsonl", "out.rejects.jsonl", "ref-A.jsonl",
                                                          "ref-A.rejects.jsonl", "ref-B.jsonl", "ref-B.rejects.jsonl"]


def _rec(uuid, parent, kind, content, mid=None):
    r = {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s", "message": {"role": kind, "content": content}}
    if mid:
        r["message"]["id"] = mid
    return r


def test_an_orphan_tool_result_is_rejected_with_its_reason(tmp_path):
    """Line 5 answers tool_use "nope", which no tool_use issued; line 7 carries such a result and a
    question. Old code: both dropped silently (a note) and counted as imported. Now line 5 is rejected
    (orphan_tool_result, not imported), line 7 is kept with the same reason as a warning (its text
    still reaches the model). read 8 = imported 7 + skipped 0 + rejected 1."""
    rows = [
        _rec("u1", None, "user", "list the files"),
        _rec("a1", "u1", "assistant", [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}], "m1"),
        _rec("u2", "a1", "user", [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]),
        _rec("a2", "u2", "assistant", [{"type": "text", "text": "one file"}], "m2"),
        _rec("u3", "a2", "user", [{"type": "tool_result", "tool_use_id": "nope", "content": "stray"}]),
        _rec("a3", "u3", "assistant", [{"type": "text", "text": "hm"}], "m3"),
        _rec("u4", "a3", "user", [{"type": "tool_result", "tool_use_id": "nope2", "content": "stray too"},
                                  {"type": "text", "text": "and now?"}]),
        _rec("a4", "u4", "assistant", [{"type": "text", "text": "done"}], "m4"),
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_import("claude-code", [path])
    c = result.counts()
    assert (c["read"], c["imported"], c["skipped"], c["rejected"]) == (8, 7, 0, 1)
    assert c["rejects_by_reason"] == {"orphan_tool_result": 1} and c["warnings_by_reason"] == {"orphan_tool_result": 1}
    assert [(r.line, r.reason, r.kept) for r in result.rejects] == [(5, "orphan_tool_result", False),
                                                                    (7, "orphan_tool_result", True)]
    assert "'nope', which no tool_use in the input issued" in result.rejects[0].message
    (traj,) = result.trajectories
    table = traj.message_table()
    last = [table[m].content for m in traj.calls[-1].context]
    assert "stray" not in last and "stray too" not in last and "and now?" in last
