"""Nothing leaked by ``--redact`` (issue 15, failure 3; issue 27, failure 3): a corpus of secret shapes
planted in message text, thinking, tool arguments of any name, tool results, metadata, the file path
of a Claude Code session and its rejects, each asserted absent from the imported output and from the
rejects file; a secret found once is replaced wherever it recurs, by the same placeholder."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from memorywalker.cli.main import app
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
    # issue 27
    ("stripe live key", "sk_live_51HqLyjWDarjtT1zdp7dc", "stripe {}"),
    ("stripe restricted key", "rk_live_51HqLyjWDarjtT1zdp7dX", "rk {}"),
    ("short bearer token", "abc123XY", "Authorization: Bearer {}"),
    ("STRIPE_KEY= (low entropy)", "plainvalue42", "STRIPE_KEY={}"),
    ("SENDGRID_KEY=SG.", "SG.ngeVfQFYQlKU0ufo8x5d1A.TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc", "SENDGRID_KEY={}"),
    ("DB_PASS=", "hunter22", "DB_PASS={}"),
    ("NAME=random, any name", "q8Zt3LmN0pR7vX2wK9yB4cD6", "FOO_SETTING={}"),
    ("bare aws secret key", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws secret {} ok"),
    ("json api_key", "Zq81LmPa", '{{"api_key": "{}"}}'),
    ("pem private key", "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1c2Rn8s9XkQ\nq2WfZ+a8==\n-----END RSA PRIVATE KEY-----",
     "key:\n{}\n"),
    ("pem body", "MIIEowIBAAKCAQEA1c2Rn8s9XkQ", "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n-----END OPENSSH PRIVATE KEY-----"),
    ("us phone", "(415) 555-0132", "call {} now"),
    ("international phone", "+44 20 7946 0958", "or {}"),
    ("private ip 10/8", "10.1.22.33", "ssh {}"),
    ("private ip 172.16/12", "172.20.3.4", "host {}:8080"),
    ("private ip 192.168/16", "192.168.1.50", "at {}"),
    ("json-escaped windows home", "C:\\\\Users\\\\frank", '{{"cwd": "{}\\\\src"}}'),
    ("windows home, forward slashes", "C:/Users/gina", "open {}/notes.txt"),
    ("json-escaped unix home", "\\/home\\/hank", '{{"p": "{}\\/x"}}'),
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
        assert json.dumps(secret)[1:-1] not in out, shape  # as JSON escapes it
    assert "erin" not in out
    assert "-<HOME_" in traj.lineage.source_path and traj.lineage.source_path.endswith("-work-app/session.jsonl")
    args = traj.message_table()[traj.calls[0].response].tool_calls[0].arguments["command"]
    assert args.startswith("psql postgres://<CREDENTIALS_") and "@db/app; cat <HOME_" in args


def test_same_user_same_placeholder_in_every_form():
    r = Redactor()
    plain = r.text("/home/john-doe/src")
    dashed = r.text(".claude/projects/-home-john-doe-src")
    assert plain == "<HOME_1>/src" and dashed == ".claude/projects/-<HOME_1>-src"


# --- issue 27: a secret found once is gone everywhere -------------------------------------------------

PASSWORD = "Tr0ub4dor&3"


def _assistant(uuid, parent, blocks, mid, model="claude-x"):
    return {"type": "assistant", "uuid": uuid, "parentUuid": parent, "sessionId": "s1",
            "timestamp": "2025-01-01T00:00:05Z", "message": {"id": mid, "role": "assistant", "model": model,
                                                              "content": blocks}}


def test_import_redacts_every_occurrence_everywhere_and_the_rejects(tmp_path):
    """Old code missed every issue-27 shape of the corpus; skipped tool arguments named context, schema,
    id, parent, response, removed or inserted (as if they were record ids); left a password it redacted
    in a URL readable where the assistant repeated it bare (text and thinking); and never redacted
    out.rejects.jsonl (its source holds the home path and the user name erin). Every secret of the
    corpus is planted in the user text, in thinking, in tool arguments under each of those names, in the
    tool result and in metadata (the model name); a record of an unknown type carries one into the
    rejects. None may remain in the output or the rejects file, nor the user name, nor the password;
    the same planted text redacts to the same string wherever it is (one placeholder per secret)."""
    planted = " | ".join(t.format(s) for _, s, t in CORPUS)
    args = {name: planted for name in ("context", "schema", "id", "parent", "response", "removed", "inserted")}
    rows = [
        _cc("u1", None, "user", f"{planted} || db: postgres://admin:{PASSWORD}@db.internal/app, thanks erin"),
        _assistant("a1", "u1", [{"type": "thinking", "thinking": f"the password {PASSWORD} is weak; {planted}"},
                                {"type": "text", "text": f"your password {PASSWORD} is weak"},
                                {"type": "tool_use", "id": "t1", "name": "Bash", "input": args}], "m1",
                   model=f"claude-x {planted}"),
        _cc("u2", "a1", "user", [{"type": "tool_result", "tool_use_id": "t1", "content": planted}]),
        _assistant("a2", "u2", [{"type": "text", "text": f"done, erin ({PASSWORD})"}], "m2"),
        {"type": f"weird {CORPUS[19][1]} for erin", "uuid": "w1"},
    ]
    folder = tmp_path / ".claude" / "projects" / "-home-erin-work-app"
    folder.mkdir(parents=True)
    (folder / "session.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # A second session of the same project repeats the password: the same placeholder across trajectories.
    (folder / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {**_cc("v1", None, "user", f"again {PASSWORD}"), "sessionId": "s2"},
        {**_assistant("b1", "v1", [{"type": "text", "text": "ok"}], "n1"), "sessionId": "s2"}]))
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["import", "claude-code", str(folder), "-o", str(out), "--redact"])
    assert res.exit_code == 0, res.output
    written = out.read_text() + (tmp_path / "out.rejects.jsonl").read_text()
    rejects = [json.loads(ln) for ln in (tmp_path / "out.rejects.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejects] == ["unknown_record_type"] and "-<HOME_" in rejects[0]["source"]
    for shape, secret, _ in CORPUS:
        assert secret not in written and json.dumps(secret)[1:-1] not in written, shape
    assert "erin" not in written and PASSWORD not in written and json.dumps(PASSWORD)[1:-1] not in written

    trajs = {t["id"]: t for t in map(json.loads, out.read_text().splitlines())}
    main, other = trajs["s1"], trajs["s2"]
    table = {m["id"]: m for m in main["messages"]}
    user, reply = table["u1"]["content"], table[main["calls"][0]["response"]]
    redacted = user.split(" || ")[0]
    assert reply["reasoning"].endswith(redacted) and table["u2"]["content"] == redacted
    assert all(v == redacted for v in reply["tool_calls"][0]["arguments"].values())
    assert reply["meta"]["model"] == f"claude-x {redacted}"
    ph = reply["content"].split()[2]
    assert ph.startswith("<PASSWORD_") and reply["content"] == f"your password {ph} is weak"
    assert reply["reasoning"].startswith(f"the password {ph} is weak")
    assert re.search(r"db: postgres://<CREDENTIALS_\d+>@db.internal/app, thanks <USER_1>$", user)
    assert table[main["calls"][1]["response"]]["content"] == f"done, <USER_1> ({ph})"
    assert {m["content"] for m in other["messages"]} >= {f"again {ph}"}


# --- the other formats: every content path of each importer, and what unknown records carried ---------

_CONTENT_KEYS = {"text", "content", "thinking", "output", "command", "result", "summary", "message", "reasoning",
                 "thought"}
_UNKNOWN = {"type": "weird-kind", "role": "weird", "id": "w9"}


def _plant(x, planted: str):
    """Every string under a content key of a valid input, with the corpus appended."""
    if isinstance(x, dict):
        return {k: v + " " + planted if k in _CONTENT_KEYS and isinstance(v, str) else _plant(v, planted)
                for k, v in x.items()}
    if isinstance(x, list):
        return [_plant(v, planted) for v in x]
    return x


def _leaked(text: str) -> list[str]:
    return [shape for shape, secret, _ in CORPUS if secret in text or json.dumps(secret)[1:-1] in text]


@pytest.mark.parametrize("fmt", ["cline", "codex", "gemini-cli", "hf-traces", "opencode", "openhands", "pi", "roo-code"])
def test_every_format_leaks_nothing(tmp_path, fmt):
    """The fuzz test's valid sample of each format with the whole corpus appended to every text,
    thinking, tool-output and command string, and (list inputs) one record of an unknown kind carrying
    it. Without --redact every secret reaches the trajectories (the planting is not vacuous) and the
    unknown record's reject carries some in its ``detail`` (what ``--debug`` prints; cut at 600
    characters). With --redact none remains in the trajectories nor in any reject, detail included."""
    from test_import_fuzz import _samples, _write

    planted = " | ".join(t.format(s) for _, s, t in CORPUS)
    name, doc = _samples()[fmt]
    doc = _plant(doc, planted)
    if isinstance(doc, list):
        doc = [*doc, {**_UNKNOWN, "note": planted}]
    path = tmp_path / name
    _write(path, doc)

    plain = run_import(fmt, [path])
    assert plain.trajectories
    assert _leaked(json.dumps([t.to_json_dict() for t in plain.trajectories], ensure_ascii=False)) == [s for s, _, _ in CORPUS]
    details = [r.detail for r in plain.rejects if r.detail]
    if isinstance(doc, list) and fmt != "codex":  # codex does not reject on the type field: it has none of its own
        assert details and _leaked(" ".join(details))

    result = run_import(fmt, [path], ImportOptions(redact=True))
    assert len(result.trajectories) == len(plain.trajectories)
    written = json.dumps([t.to_json_dict() for t in result.trajectories], ensure_ascii=False)
    written += json.dumps([r.as_dict() for r in result.rejects], ensure_ascii=False)
    assert _leaked(written) == []
    assert all(r.detail for r in result.rejects if r.detail is not None)


def test_debug_prints_what_unknown_records_carried_redacted(tmp_path):
    """``--debug import --redact`` prints each unknown record's detail after redaction: no secret of the
    corpus in the terminal output, the placeholders instead (Pi: an entry of an unknown type)."""
    from test_import_pi import _v3_session

    planted = " | ".join(t.format(s) for _, s, t in CORPUS)
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*_v3_session(), {**_UNKNOWN, "note": planted}]))
    res = CliRunner().invoke(app, ["--debug", "import", "pi", str(path), "-o", str(tmp_path / "o.jsonl"), "--redact"])
    assert res.exit_code == 0, res.output
    assert "carried: " in res.output and "<API_KEY_" in res.output
    assert _leaked(res.output) == []


def test_a_secret_cut_by_the_detail_limit_leaves_no_fragment():
    """``detail`` is cut at 600 characters (importers.base.carried). Here the cut falls 11 characters
    into a Stripe key: ``sk_live_51H`` is too short for the key's pattern (10+ characters after
    ``sk_live_``), so the redactor drops the token run the cut ends in; the text before it stays."""
    from memorywalker.importers.base import ImportResult, carried
    from memorywalker.importers.redact import redact_import

    secret = "sk_live_51HqLyjWDarjtT1zdp7dc"
    head = '{"type":"weird","note":"'
    obj = {"type": "weird", "note": "x" * (600 - len(head) - 12) + " " + secret}
    detail = carried(obj)
    assert detail[:600].endswith(" sk_live_51H")
    result = ImportResult()
    result.reject("s.jsonl", 1, "unknown_record_type", "line 1: record type 'weird'", detail=detail)
    redact_import(result)
    (r,) = result.rejects
    total = len(json.dumps(obj, separators=(",", ":")))
    assert "sk_live" not in r.detail and r.detail == detail[:600 - len(" sk_live_51H")] + f" … ({total} chars)"
