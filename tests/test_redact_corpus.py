"""Nothing leaked by ``--redact`` (issue 15, failure 3): a corpus of secret shapes planted in message
text, tool arguments, tool results and the file path of a Claude Code session, each asserted absent
from the imported output."""

from __future__ import annotations

import json

import pytest

from memorywalker.importers import ImportOptions, run_import
from memorywalker.importers.redact import Redactor

# (shape, the secret that must disappear, how it is planted in text)
CORPUS = [
    ("anthropic key", "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWx", "key {}"),
    ("openai key", "sk-proj-Zz9Yy8Xx7Ww6Vv5Uu4Tt3", "OPENAI_API_KEY={}"),
    ("github token", "ghp_0123456789abcdefghijABCDEFGHIJ", "token {}"),
    ("aws key id", "AKIAIOSFODNN7EXAMPLE", "aws {}"),
    ("google key", "AIzaSyA1234567890abcdefghijklmnopqrstuv", "g {}"),
    ("slack token", "xoxb-1234567890-abcdefghij", "slack {}"),
    ("hf token", "hf_abcdefghijklmnopqrstuvwxyz1234", "hf {}"),
    ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "Bearer {}"),
    ("redis url password", "s3cr3tpw", "redis://:{}@cache.internal:6379/0"),
    ("https url user:password", "hunter2", "https://alice:{}@git.example.com/repo.git"),
    ("postgres url password", "pw", "postgres://admin:{}@db/app"),
    ("postgres url user", "dbadmin", "postgresql://{}:x@db.example.com:5432/app"),
    ("connection string password", "Tr0ub4dor", "Server=db;User Id=sa;Password={};"),
    ("env password", "pgpw", "PGPASSWORD={} psql -h db"),
    ("e-mail", "alice.smith@example.org", "mail {}"),
    ("home path", "/home/alice", "cd {}/proj"),
    ("macOS home", "/Users/bob", "ls {}/Desktop"),
    ("windows home", "C:\\Users\\carol", "dir {}\\Documents"),
    ("dash-encoded home", "-home-dave-", "~/.claude/projects{}work/s.jsonl"),
]


@pytest.mark.parametrize("shape, secret, template", CORPUS, ids=[c[0] for c in CORPUS])
def test_each_shape_is_redacted_in_text(shape, secret, template):
    out = Redactor().text(template.format(secret))
    assert secret not in out, (shape, out)
    assert "<" in out  # replaced by a placeholder, not deleted


def _cc(uuid, parent, kind, content, mid=None):
    r = {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s1", "timestamp": f"2025-01-01T00:00:0{uuid[-1]}Z",
         "message": {"role": kind, "content": content}}
    if mid:
        r["message"]["id"] = mid
    return r


def test_claude_code_import_leaks_nothing(tmp_path):
    """Old code: URL passwords survived (or were half-redacted as e-mails) and the user name stayed in
    lineage.source_path through Claude Code's dash-encoded project folder. Every secret of the corpus is
    planted in the user text, in tool arguments and in tool results; the session lives in
    ``.claude/projects/-home-erin-work-app/``. None of them, and not the user name ``erin``, may remain."""
    planted = " | ".join(t.format(s) for _, s, t in CORPUS)
    rows = [
        _cc("u1", None, "user", f"please look: {planted}"),
        _cc("a1", "u1", "assistant", [{"type": "tool_use", "id": "t1", "name": "Bash",
                                       "input": {"command": f"psql postgres://admin:pw@db/app; cat /home/erin/.env; {planted}"}}], "m1"),
        _cc("u2", "a1", "user", [{"type": "tool_result", "tool_use_id": "t1", "content": f"DATABASE_URL=redis://:s3cr3tpw@h {planted}"}]),
        _cc("a2", "u2", "assistant", [{"type": "text", "text": "done"}], "m2"),
    ]
    folder = tmp_path / ".claude" / "projects" / "-home-erin-work-app"
    folder.mkdir(parents=True)
    path = folder / "session.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_import("claude-code", [path], ImportOptions(redact=True))
    (traj,) = result.trajectories
    assert len(traj.calls) == 2
    out = json.dumps([t.to_json_dict() for t in result.trajectories])
    for shape, secret, _ in CORPUS:
        assert secret not in out, shape
        assert secret.replace("\\", "\\\\") not in out, shape  # as JSON escapes it
    assert "erin" not in out
    assert "-<HOME_" in traj.lineage.source_path and traj.lineage.source_path.endswith("-work-app/session.jsonl")
    args = traj.message_table()[traj.calls[0].response].tool_calls[0].arguments["command"]
    assert args.startswith("psql postgres://<CREDENTIALS_") and "@db/app; cat <HOME_" in args


def test_same_user_same_placeholder_in_every_form():
    r = Redactor()
    plain = r.text("/home/john-doe/src")
    dashed = r.text(".claude/projects/-home-john-doe-src")
    assert plain == "<HOME_1>/src" and dashed == ".claude/projects/-<HOME_1>-src"
