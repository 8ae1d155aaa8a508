"""The gateway against the official ``anthropic`` and ``openai`` SDKs, on the kit model.

What the SDK parses must equal what was recorded, and every call's ``context_tokens`` must equal an
independent render of the request: the request's JSON turned into Hugging Face message dicts here, by
hand, and tokenized by ``tokenizer.apply_chat_template`` — no gateway code in between.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from memorywalker.gateway.core import finalize_all  # noqa: E402
from memorywalker.gateway.journal import read_journal  # noqa: E402
from memorywalker.gateway.server import BackgroundServer  # noqa: E402
from memorywalker.records import read_trajectories  # noqa: E402

SCRIPT = """
steps:
  - text: "Let me look."
    tool_calls: [{name: Read, arguments: {file_path: "{cwd}/notes.txt"}}]
  - tool_calls: [{name: Bash, arguments: {command: "ls -1"}}]
  - text: "Done: the notes say hello."
rules:
  - match: {last_user: "create a detailed summary of the conversation"}
    text: "Summary: read notes.txt (hello), ran ls."
"""
TOOLS = [{"name": "Read", "description": "Read a file.", "input_schema": {
             "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}},
         {"name": "Bash", "description": "Run a command.", "input_schema": {
             "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
OPENAI_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                  "parameters": t["input_schema"]}} for t in TOOLS]
SYSTEM = "You are an agent. Working directory: /work/task"


def make_gateway(kit, out: Path, tmp_path: Path, script: str = SCRIPT, **kw):
    from memorywalker.cli.gateway_cmd import build_gateway

    path = tmp_path / "script.yaml"
    path.write_text(script)
    return build_gateway(str(kit[1]), f"scripted:{path}", out, tokenizer=str(kit[0]), **kw)


@pytest.fixture()
def served(kit, tmp_path):
    gw = make_gateway(kit, tmp_path / "out", tmp_path)
    server = BackgroundServer(gw)
    url = server.start()
    yield url, gw, tmp_path / "out"
    server.stop()


def independent_ids(tokenizer, system: str, messages: list[dict], tools: list[dict]) -> list[int]:
    """Anthropic request → HF dicts by hand (text blocks joined by blank lines, tool_result → tool turn)."""
    hf = [{"role": "system", "content": system}]
    for m in messages:
        blocks = [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"]
        if m["role"] == "assistant":
            hf.append({"role": "assistant", "content": "".join(b["text"] for b in blocks if b["type"] == "text"),
                       "tool_calls": [{"type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
                                      for b in blocks if b["type"] == "tool_use"] or None})
            continue
        texts = []
        for b in blocks:
            if b["type"] == "tool_result":
                hf.append({"role": "tool", "content": b["content"]})
            else:
                texts.append(b["text"])
        if texts:
            hf.append({"role": "user", "content": "\n\n".join(texts)})
    schemas = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                 "parameters": t["input_schema"]}} for t in tools]
    for d in hf:
        if d.get("tool_calls") is None:
            d.pop("tool_calls", None)
    return tokenizer.apply_chat_template(hf, tools=schemas, add_generation_prompt=True, tokenize=True,
                                         return_dict=False)


def tool_turn(client, session: str, messages: list[dict], result: str):
    """One Anthropic call of ``session``; its reply and a tool_result for its tool_use appended to ``messages``."""
    reply = client.messages.create(model="kit", max_tokens=300, system=SYSTEM, messages=messages, tools=TOOLS,
                                   extra_headers={"x-claude-code-session-id": session})
    uses = [b for b in reply.content if b.type == "tool_use"]
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
    if uses:
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": result}
                                                      for u in uses]})
    return reply


def journal(out: Path) -> list[dict]:
    records = []
    for p in sorted((out / "sessions").glob("*.jsonl*")):
        records += [r for r in read_journal(p)[0] if r.get("kind") == "call"]
    return records


def test_anthropic_sdk_session_records_what_was_sent(served, tokenizer):
    """Three calls of one session (non-streaming, streaming, streaming): each parsed reply equals the
    recorded response, each context_tokens equals the independent render, and each call extends the
    previous one by tokens (no branch), so the trajectory has 0 evictions."""
    url, gw, out = served
    client = anthropic.Anthropic(base_url=url, api_key="x")
    head = {"x-claude-code-session-id": "sess-a"}
    messages = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>be brief</system-reminder>"},
                                              {"type": "text", "text": "Read the notes."}]}]
    first = client.messages.create(model="kit", max_tokens=300, system=SYSTEM, messages=messages, tools=TOOLS,
                                   extra_headers=head)
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["text", "tool_use"]
    assert first.content[1].input == {"file_path": "/work/task/notes.txt"}
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[1].id,
                                                  "content": "hello"}]})
    with client.messages.stream(model="kit", max_tokens=300, system=SYSTEM, messages=messages, tools=TOOLS,
                                extra_headers=head) as stream:
        second = stream.get_final_message()
    assert second.content[0].type == "tool_use" and second.content[0].input == {"command": "ls -1"}
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in second.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": second.content[0].id,
                                                  "content": "notes.txt"}]})
    with client.messages.stream(model="kit", max_tokens=300, system=SYSTEM, messages=messages, tools=TOOLS,
                                extra_headers=head) as stream:
        third = stream.get_final_message()
    assert third.stop_reason == "end_turn" and third.content[0].text == "Done: the notes say hello."

    calls = journal(out)
    assert [c["seq"] for c in calls] == [0, 1, 2]
    for k, (call, reply) in enumerate(zip(calls, [first, second, third], strict=True)):
        expect = independent_ids(tokenizer, SYSTEM, messages[: 2 * k + 1], TOOLS)
        assert call["context_tokens"] == expect, f"call {k}"
        assert reply.usage.input_tokens == len(expect)
        assert len(call["rollout_logprobs"]) == len(call["response_tokens"]) == reply.usage.output_tokens
        sent = [b for b in reply.content if b.type == "tool_use"]
        assert [(t["id"], t["name"], t["arguments"]) for t in call["response"]["tool_calls"]] == \
               [(b.id, b.name, b.input) for b in sent]
        text = "".join(b.text for b in reply.content if b.type == "text")
        assert call["response"]["content"] == text
    gw.close()
    (traj,) = read_trajectories(out / "trajectories.jsonl")
    assert traj.id == "sess-a" and len(traj.calls) == 3 and traj.evictions == []
    assert traj.meta["policy"]["temperature"] == 1.0


def test_openai_chat_sdk_streaming_and_not(served, tokenizer):
    url, gw, out = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    head = {"x-session-id": "oc-1"}
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Read the notes."}]
    r = client.chat.completions.create(model="kit", messages=messages, tools=OPENAI_TOOLS, extra_headers=head)
    (tc,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content == "Let me look."
    assert json.loads(tc.function.arguments) == {"file_path": "/work/task/notes.txt"}
    messages += [{"role": "assistant", "content": r.choices[0].message.content,
                  "tool_calls": [tc.model_dump()]},
                 {"role": "tool", "tool_call_id": tc.id, "content": "hello"}]
    chunks = list(client.chat.completions.create(model="kit", messages=messages, tools=OPENAI_TOOLS, stream=True,
                                                 stream_options={"include_usage": True}, extra_headers=head))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert calls[0].function.name == "Bash"
    assert json.loads("".join(t.function.arguments or "" for t in calls)) == {"command": "ls -1"}
    assert chunks[-1].usage.prompt_tokens == len(journal(out)[1]["context_tokens"])
    recorded = journal(out)
    assert recorded[1]["context_tokens"][: len(recorded[0]["context_tokens"]) + len(recorded[0]["response_tokens"])] \
        == recorded[0]["context_tokens"] + recorded[0]["response_tokens"]
    hf = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Read the notes."}]
    assert recorded[0]["context_tokens"] == tokenizer.apply_chat_template(
        hf, tools=OPENAI_TOOLS, add_generation_prompt=True, tokenize=True,
        return_dict=False)


def test_openai_responses_sdk_streaming_and_not(served):
    url, gw, out = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    tools = [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
             for t in TOOLS]
    head = {"session-id": "codex-1"}
    r = client.responses.create(model="kit", instructions=SYSTEM, input="Read the notes.", tools=tools,
                                extra_headers=head)
    kinds = [o.type for o in r.output]
    assert kinds == ["message", "function_call"] and r.output[0].content[0].text == "Let me look."
    fc = r.output[1]
    items = [{"role": "user", "content": "Read the notes."}, {"role": "assistant", "content": "Let me look."},
             {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
             {"type": "function_call_output", "call_id": fc.call_id, "output": "hello"}]
    with client.responses.stream(model="kit", instructions=SYSTEM, input=items, tools=tools,
                                 extra_headers=head) as stream:
        final = stream.get_final_response()
    assert final.output[0].type == "function_call" and json.loads(final.output[0].arguments) == {"command": "ls -1"}
    recorded = journal(out)
    assert final.usage.input_tokens == len(recorded[1]["context_tokens"])
    seq0 = recorded[0]["context_tokens"] + recorded[0]["response_tokens"]
    assert recorded[1]["context_tokens"][: len(seq0)] == seq0  # the echoed turn renders to the sampled ids


def test_compaction_is_a_summarize_branch_and_exact_methods_sit_at_the_floor(served, kit):
    """A session whose harness asks for a summary and restarts from it: the summary call is purpose
    summarize, the next call a ``summarize`` eviction whose inserted message is a harness artifact;
    radix / tree-mask / logit-tree reproduce the recorded logprobs (≤ 1e-5), dfs does not after the branch."""
    import torch

    from memorywalker.metrics.gap import gap_report
    from memorywalker.render import Renderer
    from memorywalker.train.model import load_model

    url, gw, out = served
    client = anthropic.Anthropic(base_url=url, api_key="x")
    head = {"x-claude-code-session-id": "sess-c"}
    messages = [{"role": "user", "content": "Read the notes."}]
    tool_turn(client, "sess-c", messages, "hello")
    summary_request = messages + [{"role": "assistant", "content": "I read it."},
                                  {"role": "user", "content": "Now create a detailed summary of the conversation."}]
    summary = client.messages.create(model="kit", max_tokens=300, system=SYSTEM, messages=summary_request,
                                     tools=TOOLS, extra_headers=head)
    restarted = [{"role": "user", "content": "This session continues a previous one. "
                                             + summary.content[0].text + "\nGo on."}]
    client.messages.create(model="kit", max_tokens=300, system=SYSTEM, messages=restarted, tools=TOOLS,
                           extra_headers=head)
    gw.close()
    (traj,) = read_trajectories(out / "trajectories.jsonl")
    assert [c.purpose for c in traj.calls] == ["act", "summarize", "act"]
    (ev,) = traj.evictions
    assert ev.kind == "summarize" and ev.before_call == "call-2"
    table = traj.message_table()
    assert [table[i].author for i in ev.inserted] == ["harness"]
    lm, tok = load_model(str(kit[1]), str(kit[0]), dtype="float32", device=torch.device("cpu"))
    report = gap_report(lm, Renderer(tok), [traj], ["radix", "tree-mask", "logit-tree", "dfs"], drift=False)
    for m in ("radix", "tree-mask", "logit-tree"):
        assert report[m]["overall"]["logprob_abs_diff"] <= 1e-5, m
    assert report["dfs"]["by_branches"]["1"]["logprob_abs_diff"] > 1e-3


def _post(url: str, path: str, body: bytes | dict, **headers) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=data, headers={"content-type": "application/json", **headers}, timeout=60)


@pytest.mark.parametrize("path,shape", [("/v1/messages", "anthropic"), ("/v1/chat/completions", "openai"),
                                        ("/v1/responses", "openai")])
def test_bad_requests_get_their_dialects_error_and_the_gateway_keeps_serving(served, path, shape):
    url, gw, out = served

    def message(r):
        body = r.json()
        if shape == "anthropic":
            kind = "request_too_large" if r.status_code == 413 else "invalid_request_error"
            assert body["type"] == "error" and body["error"]["type"] == kind
            return body["error"]["message"]
        assert set(body["error"]) >= {"message", "type"}
        return body["error"]["message"]

    r = _post(url, path, b'{"model": "kit", "messages": [')
    assert r.status_code == 400 and "not JSON" in message(r)
    key = "input" if path == "/v1/responses" else "messages"
    r = _post(url, path, {"model": "kit", key: 7})
    assert r.status_code == 400 and f"request.{key}" in message(r)
    r = _post(url, path, {"model": 3, key: []})
    assert r.status_code == 400 and "request.model" in message(r)
    r = _post(url, path, b"{" + b" " * (64 << 20) + b"}")
    assert r.status_code == 413 and "size limit" in message(r)
    r = _post(url, path, b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")  # was a 500 RecursionError
    assert r.status_code == 400 and "nests too deeply" in message(r)
    good = ({"model": "kit", "input": "hi"} if path == "/v1/responses"
            else {"model": "kit", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]})
    cap = {"/v1/messages": "max_tokens", "/v1/chat/completions": "max_tokens", "/v1/responses": "max_output_tokens"}
    for field, value, said in [(cap[path], -1, "must be at least 1, got -1"),  # was 200 with an empty reply
                               (cap[path], 0, "must be at least 1, got 0"),
                               ("temperature", -0.5, "must be a number ≥ 0, got -0.5"),
                               ("top_p", 0, "must be in (0, 1], got 0")]:
        r = _post(url, path, good | {field: value})
        assert r.status_code == 400 and message(r) == f"request.{field}: {said}", (field, r.text)
    assert _post(url, path, good).status_code == 200
    assert journal(out) and gw.stats["errors"] == 9


def test_prompt_longer_than_the_model_is_400_with_the_length(kit, tmp_path):
    """400 with the providers' wording, not 413: OpenCode compacts and retries on 413, forever."""
    gw = make_gateway(kit, tmp_path / "out", tmp_path)
    gw.max_positions = 64
    with BackgroundServer(gw) as url:
        r = _post(url, "/v1/messages", {"model": "kit", "max_tokens": 10,
                                        "messages": [{"role": "user", "content": "word " * 200}]})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"].startswith("prompt is too long: ")
        assert "> 63 maximum" in err["message"]
    assert not (tmp_path / "out" / "trajectories.jsonl").exists()  # nothing half-recorded


class _Upstream:
    """A fake upstream of one behaviour: refuse (closed port), hang, or answer garbage."""

    def __init__(self, mode: str):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.mode = mode
        if mode == "down":
            self.sock.close()
            return
        self.sock.listen(8)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.mode == "garbage":
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!")
                conn.close()
            # "slow": keep the connection open and never answer


@pytest.mark.parametrize("mode,status", [("down", 502), ("slow", 504), ("garbage", 502)])
def test_upstream_failures_are_502_504_and_other_sessions_go_on(kit, tmp_path, mode, status):
    from memorywalker.cli.gateway_cmd import build_gateway

    upstream = _Upstream(mode)
    gw = build_gateway(str(kit[1]), f"openai:http://127.0.0.1:{upstream.port}", tmp_path / "out",
                       tokenizer=str(kit[0]))
    gw.backend.policy.timeout = 1.0
    with BackgroundServer(gw) as url:
        r = _post(url, "/v1/chat/completions", {"model": "kit", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == status, r.text
        assert r.json()["error"]["message"].startswith("the backend failed: ")
        assert (_post(url, "/health", b"").status_code == 405)  # still serving
        assert httpx.get(url + "/health").json()["ok"]
    assert journal(tmp_path / "out") == []


def test_client_disconnecting_mid_stream_leaves_the_call_recorded(kit, tmp_path):
    """A long scripted answer streamed to a client that reads one chunk and leaves: the call is in the
    journal whole (it was journaled before the first byte) and the next session is served. Whether the
    server notices the disconnect depends on the socket buffers (a loopback client's kernel buffer can
    hold the whole stream), so the ``undelivered`` note is checked on the stream itself, closed early."""
    import asyncio

    from memorywalker.gateway import anthropic as dialect
    from memorywalker.gateway.app import _stream

    script = "steps:\n  - text: \"" + "word " * 3000 + "\"\n"
    gw = make_gateway(kit, tmp_path / "out", tmp_path, script=script, max_new_tokens=4000)
    with BackgroundServer(gw) as url:
        body = {"model": "kit", "max_tokens": 4000, "stream": True, "tools": TOOLS,
                "messages": [{"role": "user", "content": "go"}]}
        with httpx.stream("POST", url + "/v1/messages", json=body, headers={"x-claude-code-session-id": "gone"},
                          timeout=120) as r:
            next(r.iter_raw(64))
        r = _post(url, "/v1/messages", {"model": "kit", "max_tokens": 20, "messages": [{"role": "user", "content": "x"}]},
                  **{"x-claude-code-session-id": "next"})
        assert r.status_code == 200
        request = dialect.parse(body | {"stream": True})
        reply, record = gw.serve(request, ("x-claude-code-session-id", "cut"), body)

        async def read_one_event():
            events = _stream(gw, dialect, reply, request, record)
            await events.__anext__()
            await events.aclose()  # what Starlette does when the client goes away

        asyncio.run(read_one_event())
    trajs = {t.id: t for t in read_trajectories(tmp_path / "out" / "trajectories.jsonl")}
    assert set(trajs) == {"gone", "next", "cut"}
    (call,) = trajs["gone"].calls
    assert len(call.response_tokens) > 2000 and len(call.rollout_logprobs) == len(call.response_tokens)
    assert trajs["cut"].calls[0].meta["undelivered"] == "the client disconnected mid-stream"


def test_eight_sessions_at_once_never_mix(served):
    url, gw, out = served
    errors = []

    def session(k: int):
        try:
            client = anthropic.Anthropic(base_url=url, api_key="x")
            messages = [{"role": "user", "content": f"Task {k}: read the notes."}]
            for _ in range(3):
                tool_turn(client, f"par-{k}", messages, f"result for task {k}")
        except Exception as e:  # noqa: BLE001 — collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=session, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    gw.close()
    trajs = {t.id: t for t in read_trajectories(out / "trajectories.jsonl")}
    assert set(trajs) == {f"par-{k}" for k in range(8)}
    for k in range(8):
        t = trajs[f"par-{k}"]
        assert len(t.calls) == 3 and t.evictions == []
        text = " ".join(m.content for m in t.messages)
        assert f"Task {k}:" in text and f"task {k}" in text
        assert not any(f"ask {j}" in text for j in range(8) if j != k)


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_a_stopped_gateway_keeps_every_completed_call(kit, tmp_path, sig):
    """The CLI gateway in its own process, two calls, then ``sig``. SIGTERM (what kill, docker stop and
    systemd send) and SIGINT (Ctrl-C) finalize the open session into trajectories.jsonl and exit 0 (SIGTERM
    used to end the process with the session left in its journal); after SIGKILL both calls are in the
    journal, and the next start (or --finalize) turns them into a trajectory that loads."""
    import signal

    from conftest import gateway_process
    from memorywalker.samplers.http import free_port

    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    port = free_port()
    out = tmp_path / "out"
    proc = gateway_process(["--model", str(kit[1]), "--tokenizer", str(kit[0]), "--backend", f"scripted:{script}",
                            "--out", str(out), "--port", str(port)], port=port, cwd=tmp_path)
    try:
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="x")
        messages = [{"role": "user", "content": "Read the notes."}]
        tool_turn(client, "stopped", messages, "hello")
        tool_turn(client, "stopped", messages, "notes.txt")
    finally:
        proc.send_signal(getattr(signal, sig))
        log = proc.communicate(timeout=60)[0]
    if sig == "SIGKILL":
        assert not (out / "trajectories.jsonl").exists()
        assert finalize_all(out) == 1
    else:
        assert proc.returncode == 0 and "1 trajectories written" in log, log
    (traj,) = read_trajectories(out / "trajectories.jsonl")
    assert traj.id == "stopped" and len(traj.calls) == 2


def test_redact_keeps_secrets_off_disk_and_clean_calls_exact(kit, tmp_path):
    """--redact: a call whose request holds an API key and an e-mail is written redacted (re-tokenized,
    no logprobs, marked); a call with nothing to redact keeps its ids and logprobs as sampled."""
    gw = make_gateway(kit, tmp_path / "out", tmp_path, redact=True)
    secret, mail = "sk-abcdefghijklmnopqrstuv0123", "bob.smith@example.com"
    with BackgroundServer(gw) as url:
        client = anthropic.Anthropic(base_url=url, api_key="x")
        client.messages.create(model="kit", max_tokens=300, system=SYSTEM, tools=TOOLS,
                               messages=[{"role": "user", "content": "Read the notes."}],
                               extra_headers={"x-claude-code-session-id": "clean"})
        client.messages.create(model="kit", max_tokens=300, system=SYSTEM, tools=TOOLS,
                               messages=[{"role": "user", "content": f"My key is {secret}, mail {mail}."}],
                               extra_headers={"x-claude-code-session-id": "secret"})
    raw = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*.jsonl*"))
    assert secret.encode() not in raw and mail.encode() not in raw
    trajs = {t.id: t for t in read_trajectories(tmp_path / "out" / "trajectories.jsonl")}
    (dirty,) = trajs["secret"].calls
    assert dirty.meta["redacted"] is True and dirty.rollout_logprobs is None
    assert "<API_KEY_1>" in trajs["secret"].message_table()[dirty.context[-1]].content
    assert secret not in gw.renderer.tok.decode(dirty.context_tokens)
    (clean,) = trajs["clean"].calls
    assert "redacted" not in clean.meta and len(clean.rollout_logprobs) == len(clean.response_tokens)


def test_the_sdks_raise_their_own_errors_with_the_gateways_message(kit, tmp_path):
    """What a harness built on the SDKs sees: anthropic.BadRequestError / openai.BadRequestError whose
    message is the gateway's (the prompt's length and the model's positions), and an upstream failure as
    the SDK's server error with its status."""
    gw = make_gateway(kit, tmp_path / "out", tmp_path)
    gw.max_positions = 64
    long = "word " * 200
    with BackgroundServer(gw) as url:
        with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 63 maximum"):
            anthropic.Anthropic(base_url=url, api_key="x", max_retries=0).messages.create(
                model="kit", max_tokens=10, messages=[{"role": "user", "content": long}])
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="prompt is too long") as e:
            client.chat.completions.create(model="kit", messages=[{"role": "user", "content": long}])
        assert e.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError, match="prompt is too long"):
            client.responses.create(model="kit", input=long)
    upstream = _Upstream("down")
    from memorywalker.cli.gateway_cmd import build_gateway

    gw = build_gateway(str(kit[1]), f"openai:http://127.0.0.1:{upstream.port}", tmp_path / "out2", tokenizer=str(kit[0]))
    with BackgroundServer(gw) as url:
        with pytest.raises(anthropic.APIStatusError, match="the backend failed") as e:
            anthropic.Anthropic(base_url=url, api_key="x", max_retries=0).messages.create(
                model="kit", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 502


def test_binding_beyond_loopback_needs_a_key_and_the_key_is_checked(kit, tmp_path):
    from memorywalker.gateway.server import check_bind

    with pytest.raises(ValueError, match="--api-key"):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", "k")
    check_bind("127.0.0.1", None)
    gw = make_gateway(kit, tmp_path / "out", tmp_path)
    body = {"model": "kit", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    with BackgroundServer(gw, api_key="s3cret") as url:
        assert _post(url, "/v1/messages", body).status_code == 401
        assert _post(url, "/v1/messages", body, **{"x-api-key": "wrong"}).status_code == 401
        assert _post(url, "/v1/messages", body, **{"x-api-key": "s3cret"}).status_code == 200
        r = _post(url, "/v1/chat/completions", body, authorization="Bearer s3cret")
        assert r.status_code == 200
    assert len(journal(tmp_path / "out")) == 2  # refused calls are not recorded


def test_a_session_id_seen_again_after_finalizing_is_a_new_part(served):
    """A harness resuming a session the gateway already finalized (idle, or a restart): a second part
    with its own trajectory id, the first left as it was."""
    url, gw, out = served
    client = anthropic.Anthropic(base_url=url, api_key="x")
    tool_turn(client, "again", [{"role": "user", "content": "Read the notes."}], "hello")
    assert len(gw.finalize("again")) == 1
    messages = [{"role": "user", "content": "Read the notes."}]
    tool_turn(client, "again", messages, "hello")
    tool_turn(client, "again", messages, "notes.txt")
    gw.close()
    trajs = {t.id: t for t in read_trajectories(out / "trajectories.jsonl")}
    assert sorted(trajs) == ["again", "again#part2"]
    assert len(trajs["again"].calls) == 1 and len(trajs["again#part2"].calls) == 2


def test_a_backend_bug_is_a_500_in_the_dialects_shape(served, monkeypatch):
    url, gw, out = served

    def broken(call):
        raise KeyError("boom")

    monkeypatch.setattr(gw.backend, "sample", broken)
    r = _post(url, "/v1/chat/completions", {"model": "kit", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 500 and "KeyError" in r.json()["error"]["message"]
    monkeypatch.undo()
    r = _post(url, "/v1/chat/completions", {"model": "kit", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200


def test_a_response_sent_back_changed_is_template_drift_and_reserialized_json_is_not(served):
    """Chat: the first reply comes back once with its tool-call JSON re-serialized compactly (the same
    JSON: restored to the sampled text, no branch) and, in another session, with its text changed
    (renders to other ids: one ``template-drift`` branch, counted in the trajectory's meta)."""
    url, gw, out = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    for session, change in (("same-json", False), ("drift", True)):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Read the notes."}]
        r = client.chat.completions.create(model="kit", messages=messages, tools=OPENAI_TOOLS,
                                           extra_headers={"x-session-id": session})
        (tc,) = r.choices[0].message.tool_calls
        compact = json.dumps(json.loads(tc.function.arguments), separators=(",", ":"))
        assert compact != tc.function.arguments
        text = r.choices[0].message.content + (" " if change else "")
        messages += [{"role": "assistant", "content": text, "tool_calls": [
                         {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": compact}}]},
                     {"role": "tool", "tool_call_id": tc.id, "content": "hello"}]
        client.chat.completions.create(model="kit", messages=messages, tools=OPENAI_TOOLS,
                                       extra_headers={"x-session-id": session})
    gw.close()
    trajs = {t.id: t for t in read_trajectories(out / "trajectories.jsonl")}
    assert trajs["same-json"].evictions == [] and trajs["same-json"].meta["template_drift"] == 0
    (ev,) = trajs["drift"].evictions
    assert ev.kind == "template-drift" and trajs["drift"].meta["template_drift"] == 1
    assert ev.removed == [trajs["drift"].calls[0].response]


def test_cli_prints_each_harness_settings_and_refuses_a_public_bind_without_a_key(tmp_path):
    import subprocess
    import sys

    run = lambda *a: subprocess.run([sys.executable, "-m", "memorywalker.cli.main", "gateway", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    r = run("--settings", "--port", "9999")
    assert r.returncode == 0
    for h in ("# claude-code", "# codex", "# opencode", "ANTHROPIC_BASE_URL=http://127.0.0.1:9999",
              'base_url="http://127.0.0.1:9999/v1"', '"baseURL": "http://127.0.0.1:9999/v1"'):
        assert h in r.stdout, h
    r = run("--model", str(tmp_path), "--out", str(tmp_path / "o"), "--host", "0.0.0.0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--api-key" in r.stderr


def test_each_harness_is_told_the_served_models_window(kit):
    """The kit has 65,536 positions. Codex: ``model_context_window=65536``; OpenCode: ``limit.context`` 65536
    (it compacts at about 65,536 - 4,096); Claude Code reads a window under 100k as 100k, so it is told to
    compact at 80 % of the positions: 52,428 = 52 % of 100,823. A 200k-token model: Claude Code's window
    is 200000 and its own percentage stands. ``compact_at`` moves Codex's and Claude Code's trigger, not
    Codex's window; OpenCode's only lever is its window."""
    import subprocess
    import sys

    from memorywalker.gateway.harnesses import setup

    r = subprocess.run([sys.executable, "-m", "memorywalker.cli.main", "gateway", "--settings", "--model", "kit"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "model_context_window=65536" in r.stdout and '"context": 65536' in r.stdout
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW=100823" in r.stdout and "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=52" in r.stdout
    kw = dict(url="u", model="m", key="k", workdir=Path("."), home=Path("~"))
    assert setup("claude-code", "t", window=200_000, **kw).env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "200000"
    assert "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE" not in setup("claude-code", "t", window=200_000, **kw).env
    codex = setup("codex", "t", window=65_536, compact_tokens=16_000, **kw).argv
    assert "model_context_window=65536" in codex and "model_auto_compact_token_limit=16000" in codex
    assert setup("claude-code", "t", window=65_536, compact_tokens=30_250, **kw).env[
        "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "30"


@pytest.mark.parametrize("text,cause", [("steps: [", "not YAML/JSON"), ("- 1\n", "a mapping with a 'steps' list"),
                                        ("steps: [{txt: hi}]", "steps[0] needs 'text'"),
                                        ("steps: [{tool_calls: [{arguments: {}}]}]", "tool_calls[0] needs a 'name'"),
                                        ("steps: []\nrules: [{text: x, match: {user: y}}]", "rules[0].match")])
def test_a_bad_script_is_refused_naming_the_file_and_the_entry(tmp_path, text, cause):
    from memorywalker.gateway.backends import Scripted

    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(cause)) as e:
        Scripted.load(path)
    assert str(path) in str(e.value)


def test_hf_backend_samples_and_radix_reproduces_its_logprobs(kit, tmp_path):
    """``--backend hf``: the kit model samples (temperature 1, seeded); two calls of one session, the
    second extending the first; what the client got is the decoded sample, and ``radix`` reproduces the
    recorded logprobs within 1e-5 (responses cut at the limit compared as prefixes)."""
    import torch

    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.metrics.gap import gap_report
    from memorywalker.render import Renderer
    from memorywalker.render.render import RenderOptions
    from memorywalker.train.model import load_model

    gw = build_gateway(str(kit[1]), "hf", tmp_path / "out", tokenizer=str(kit[0]), max_new_tokens=40)
    messages = [{"role": "user", "content": "Say something."}]
    with BackgroundServer(gw) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        for _ in range(2):
            r = client.chat.completions.create(model="kit", messages=messages, extra_headers={"x-session-id": "hf"})
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": "Go on."}]
    (traj,) = read_trajectories(tmp_path / "out" / "trajectories.jsonl")
    assert len(traj.calls) == 2
    first = traj.calls[0]
    body = first.response_tokens[:-1] if first.finish_reason == "stop" else first.response_tokens
    assert gw.renderer.tok.decode(body) == messages[1]["content"]
    lm, tok = load_model(str(kit[1]), str(kit[0]), dtype="float32", device=torch.device("cpu"))
    tokens: dict = {}
    gap_report(lm, Renderer(tok, RenderOptions(truncated="prefix")), [traj], ["radix"], drift=False, tokens=tokens)
    diffs = [abs(a - b) for c in tokens[traj.id].values() for a, b in zip(c["logprob"]["radix"], c["rollout"], strict=True)
             if a is not None and b is not None]
    assert len(diffs) >= 40 and max(diffs) <= 1e-5


def test_a_call_racing_the_idle_finalizer_is_recorded(kit, tmp_path):
    """A call that took its session just before the idle reaper finalized it: whichever gets the session
    lock first, the call is recorded (in the session, or in a new part) and nothing is written to a
    closed journal."""
    import time

    from memorywalker.gateway import anthropic as dialect

    gw = make_gateway(kit, tmp_path / "out", tmp_path)
    body = {"model": "kit", "max_tokens": 50, "tools": TOOLS, "messages": [{"role": "user", "content": "go"}]}
    gw.serve(dialect.parse(body), ("x-claude-code-session-id", "race"), body)
    session = gw.sessions["race"]
    errors = []

    def call():
        try:
            gw.serve(dialect.parse(body), ("x-claude-code-session-id", "race"), body)
        except Exception as e:  # noqa: BLE001 — asserted below
            errors.append(e)

    session.lock.acquire()
    threads = [threading.Thread(target=call), threading.Thread(target=gw.finalize, args=("race",))]
    for t in threads:
        t.start()
        time.sleep(0.3)
    session.lock.release()
    for t in threads:
        t.join()
    gw.close()
    assert errors == []
    trajs = read_trajectories(tmp_path / "out" / "trajectories.jsonl")
    assert sum(len(t.calls) for t in trajs) == 2 and {t.id for t in trajs} <= {"race", "race#part2"}


def test_calls_under_r_tag_are_that_tags_sessions_and_identical_prompts_never_merge(served):
    """Two harness processes of one RL group send the same prompt without a session header, one under
    /r/a and one under /r/b: two sessions, tagged a and b, each with its own 2 calls (prefix matching
    stays within a tag); finalize_tag(a) returns a's trajectory only and leaves b open."""
    import openai

    url, gw, out = served
    for tag in ("a", "b"):
        client = openai.OpenAI(base_url=f"{url}/r/{tag}/v1", api_key="x")
        messages = [{"role": "user", "content": "Same task for both."}]
        for _ in range(2):
            r = client.chat.completions.create(model="kit", messages=messages, max_tokens=32)
            messages += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "go on"}]
    assert sorted(s.tag for s in gw.sessions.values()) == ["a", "b"]
    (a,) = gw.finalize_tag("a")
    assert a.meta["tag"] == "a" and len(a.calls) == 2 and a.id.startswith("a-anon-")
    assert [s.tag for s in gw.sessions.values()] == ["b"] and gw.finalize_tag("nobody") == []
    records = [r for p in (out / "sessions").glob("a-anon-*.jsonl.done") for r in journal_lines(p)]
    assert [r["tag"] for r in records] == ["a", "a"]


def journal_lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
