"""The gateway's core, free of HTTP: a request in, rendered once, sampled, recorded, a reply out.

For each call: the session is found (the harness's session header; without one, the open session
whose last sequence the prompt extends), tool-call arguments the harness sends back are restored to
the text that was sampled when they mean the same JSON (:meth:`Session.restore`), the messages are
rendered by the model's chat template, the prompt is tokenized keeping the ids of the sequence it
extends (:meth:`Renderer.encode_continuing`), the backend samples, the sampled text is parsed into
text and tool calls (the template's parser), and the call is journaled (fsynced) before the reply
leaves. ``usage`` reports the exact prompt length, so a harness compacts as it would deployed.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from memorywalker.errors import InputError
from memorywalker.gateway.backends import Backend, Pending
from memorywalker.gateway.dialect import BadRequest, Reply, Request, assign_ids, message_id, new_id
from memorywalker.gateway.journal import Journal, read_journal, session_file
from memorywalker.gateway.trajectory import build_session
from memorywalker.importers.redact import Redactor
from memorywalker.records.io import TrajectoryWriter
from memorywalker.records.schema import Message, ToolSchema, Trajectory
from memorywalker.render.chat_templates import use_chat_template
from memorywalker.render.render import PromptCache, Renderer
from memorywalker.render.tool_formats import FORMATS, exact_parse, format_for
from memorywalker.render.types import schemas_to_hf
from memorywalker.samplers.vllm_server import BackendDown

# Summarization requests, recognized by the prompt each harness sends (its own words; docs/gateway.md).
SUMMARY_PROMPTS = {
    "claude-code": re.compile(r"CRITICAL: Respond with TEXT ONLY\. Do NOT call any tools"
                              r"|create a detailed summary of the conversation", re.I),
    "codex": re.compile(r"CONTEXT CHECKPOINT COMPACTION"),
    "opencode": re.compile(r"You are a context summarization agent"),
}


def purpose_of(messages: list[Message]) -> str:
    """``summarize`` when the last user message or a system message holds a known summarization prompt.

    >>> from memorywalker.records.schema import Message
    >>> purpose_of([Message(id="s", role="system", content="You are a context summarization agent."),
    ...             Message(id="u", role="user", content="Here is the conversation so far: ...")])
    'summarize'
    """
    last = next((m.content for m in reversed(messages) if m.role == "user"), "")
    texts = [last[:4000], last[-4000:], *(m.content[:4000] for m in messages if m.role == "system")]
    return "summarize" if any(p.search(t) for p in SUMMARY_PROMPTS.values() for t in texts) else "act"


@dataclass
class Session:
    id: str  # the trajectory id: the harness's session id (``#partN`` when it came back after finalizing)
    source: str  # "header:<name>" | "prefix"
    journal: Journal
    key: str = ""  # what finds it in Gateway.sessions: the tag and the header's value (or the anonymous id)
    tag: str | None = None  # the URL's rollout tag (``/r/TAG/v1/...``): which harness process the calls came from
    cache: PromptCache = field(default_factory=PromptCache)
    sampled_args: dict[str, Any] = field(default_factory=dict)  # tool-call id -> arguments as sampled
    last_sequence: list[int] = field(default_factory=list)
    calls: int = 0
    compactions: int = 0
    tokens: int = 0
    last_seen: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False  # finalized: a call that waited for its lock starts a new part instead

    def restore(self, messages: list[Message]) -> None:
        """Tool calls the harness echoes back with the same JSON get the argument text that was sampled."""
        for m in messages:
            for tc in m.tool_calls:
                sampled = self.sampled_args.get(tc.id)
                if sampled is not None and sampled != tc.arguments and _same_json(sampled, tc.arguments):
                    tc.arguments = sampled


def _same_json(a: Any, b: Any) -> bool:
    def load(x):
        if isinstance(x, str):
            try:
                return json.loads(x)
            except json.JSONDecodeError:
                return x
        return x

    return load(a) == load(b)


class Gateway:
    """Sessions, rendering, sampling and recording for every dialect (see the module docstring)."""

    def __init__(self, renderer: Renderer, backend: Backend, out: str | Path, *, model_name: str,
                 max_positions: int, max_new_tokens: int = 512, seed: int = 0, harness: str | None = None,
                 temperature: float = 1.0, tool_parser: str | None = None, chat_template: str | None = None,
                 keep_requests: bool = True, redact: bool = False):
        self.renderer, self.backend, self.out = renderer, backend, Path(out)
        self.model_name, self.max_positions, self.max_new_tokens = model_name, max_positions, max_new_tokens
        self.seed, self.harness, self.keep_requests = seed, harness, keep_requests
        self.temperature = temperature  # of the distribution the recorded logprobs are of (1 when greedy)
        if redact:
            self.redactor: Redactor | None = Redactor()  # one for the gateway's life: one placeholder per secret
        else:
            self.redactor = None
        if tool_parser is not None and tool_parser not in FORMATS:
            raise InputError(f"--tool-parser {tool_parser}: not a known tool-call format ({', '.join(FORMATS)})")
        # the FORMATS key: given, or the one the chat template writes
        self.tool_parser = tool_parser or format_for(getattr(renderer.tok, "chat_template", None))
        self.chat_template = chat_template or use_chat_template(renderer.tok, None)  # the label the records carry
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._counter = 0
        self.out.mkdir(parents=True, exist_ok=True)
        self.stats = {"calls": 0, "errors": 0, "sessions": 0}
        self.backend_failures: dict[str, str] = {}  # rollout tag (or session id) -> why its server went down

    # --- sessions ---------------------------------------------------------------------------------

    def session_for(self, header: tuple[str, str] | None, prompt_ids: list[int] | None = None,
                    tag: str | None = None) -> Session:
        """The session of a call: by the harness's session header, else the open session (of the same ``tag``)
        whose last sequence the prompt extends the most, else a new one."""
        with self._lock:
            if header is not None:
                name, value = header
                sid = value
                source = f"header:{name}"
            else:
                best = max((s for s in self.sessions.values() if s.source == "prefix" and s.tag == tag
                            and s.last_sequence and prompt_ids[: len(s.last_sequence)] == s.last_sequence),
                           key=lambda s: len(s.last_sequence), default=None)
                if best is not None:
                    return best
                n = self.stats["sessions"]  # never reused, unlike len(self.sessions)
                sid, source = (f"{tag}-anon-{n}" if tag else f"anon-{int(time.time())}-{n}"), "prefix"
            key = sid if tag is None else f"{tag}/{sid}"
            session = self.sessions.get(key)
            if session is None:
                # A session id seen before (finalized when it idled, or before a restart) continues as a new part:
                # its own journal and trajectory id, never appended to a finished one.
                part, base = 1, sid
                while session_file(self.out, sid).exists() or session_file(self.out, sid).with_suffix(".jsonl.done").exists():
                    part += 1
                    sid = f"{base}#part{part}"
                session = Session(sid, source, Journal(session_file(self.out, sid)), key=key, tag=tag)
                self.sessions[key] = session
                self.stats["sessions"] += 1
            return session

    # --- one call ---------------------------------------------------------------------------------

    def render(self, request: Request, session: Session | None) -> tuple[str, list[int]]:
        """The prompt text and its token ids (continuing the session's sampled ids where the text extends them)."""
        if session is not None:
            session.restore(request.messages)
        assign_ids(request.messages)
        try:
            text = self.renderer.prompt_text(request.messages, schemas_to_hf(request.tools))
        except TemplateError as e:
            raise BadRequest(f"the model's chat template refuses this conversation: {e}") from None
        cache = session.cache if session is not None else PromptCache()
        ids = self.renderer.encode_continuing(text, cache)
        if self.renderer.decode(ids) != text:  # never deliver other text than rendered
            ids = self.renderer.tok(text, add_special_tokens=False)["input_ids"]
        return text, ids

    def count_tokens(self, request: Request) -> int:
        return len(self.render(request, None)[1])

    def serve(self, request: Request, header: tuple[str, str] | None, raw: dict | None = None,
              tag: str | None = None) -> tuple[Reply, dict]:
        """Sample a reply to ``request`` and journal the call; returns the reply and the journal record.
        ``tag``: the rollout tag of the URL the call came to (None on the plain ``/v1`` routes)."""
        started = time.monotonic()
        while True:
            ids = None if header else self.render(request, None)[1]
            session = self.session_for(header, ids, tag)
            waiting = time.monotonic()
            session.lock.acquire()  # one call of a session at a time: its sequence order is the journal's
            waited = time.monotonic() - waiting
            if not session.closed:
                break
            session.lock.release()  # finalized while this call waited (idle reaper): a new part
        try:
            return self._serve_locked(request, session, raw, started, waited)
        finally:
            session.lock.release()

    def _serve_locked(self, request: Request, session: Session, raw: dict | None, started: float,
                      waited: float = 0.0) -> tuple[Reply, dict]:
        """The call, with ``session.lock`` held (see :meth:`serve`)."""
        text, ids = self.render(request, session)
        if len(ids) >= self.max_positions:
            # 400, as Anthropic's and OpenAI's APIs answer it (413 is a body over the size limit): a
            # harness that compacts and retries on 413 (OpenCode) would loop.
            raise BadRequest(f"prompt is too long: {len(ids)} tokens > {self.max_positions - 1} maximum "
                             f"(the served model has {self.max_positions} positions)", status=400)
        limit = min(request.max_tokens or self.max_new_tokens, self.max_new_tokens, self.max_positions - len(ids))
        purpose = purpose_of(request.messages)
        with self._lock:
            self._counter += 1
            seed = self.seed * 1_000_003 + self._counter
        sampling = time.monotonic()
        try:
            out = self.backend.sample(Pending(session.id, ids, text, request.messages, request.tools, limit, seed,
                                              purpose))
        except BackendDown as e:  # its server is gone: the session's rollout fails with this reason
            with self._lock:
                self.backend_failures.setdefault(session.tag or session.id, " ".join(str(e).split())[:300])
            raise
        sampling = time.monotonic() - sampling
        reply, response = self._reply(request, out, len(ids), text)
        base = message_id(response)  # numbered past its repeats in the context, as assign_ids numbers them
        response.id = message_id(response, sum(1 for m in request.messages if m.id.split("-")[0] == base))
        record = {
            "kind": "call", "session": session.id, "session_source": session.source, "seq": session.calls,
            "id": f"call-{session.calls}", "time": time.time(), "dialect": request.dialect, "model": request.model,
            "harness": self.harness, "tag": session.tag, "purpose": purpose, "backend": self.backend.name,
            "temperature": self.temperature, "chat_template": self.chat_template, "tool_parser": self.tool_parser,
            "messages": [m.model_dump(mode="json", exclude_none=True) for m in request.messages],
            "tools": [t.model_dump(mode="json") for t in request.tools],
            "response": response.model_dump(mode="json", exclude_none=True),
            "context_tokens": ids, "response_tokens": out.token_ids,
            "rollout_logprobs": out.logprobs, "finish_reason": reply.finish,
            "parse_error": reply.parse_error, "ignored": request.ignored,
            "latency_s": round(time.monotonic() - started, 4),  # in the gateway, sampling included
            "sample_s": round(sampling, 4),  # the backend's share (a serial backend's queue included)
            "wait_s": round(waited, 4),  # behind another call of the same session (a harness's concurrent calls)
        }
        if self.keep_requests and raw is not None:
            record["request"] = raw
        if self.redactor is not None:
            record = self._redacted(record)
        session.journal.append(record)
        for tc in response.tool_calls:
            session.sampled_args[tc.id] = tc.arguments
        self.renderer.remember(session.cache, text, ids, out.token_ids)
        session.last_sequence = ids + out.token_ids
        session.calls += 1
        session.compactions += purpose == "summarize"
        session.tokens += len(ids) + len(out.token_ids)
        session.last_seen = time.monotonic()
        self.stats["calls"] += 1
        return reply, record

    def _redacted(self, record: dict) -> dict:
        """The journal record with the importers' redaction applied (``--redact``): nothing secret reaches disk.

        A call whose text changed is re-tokenized from the redacted text (its ids would decode to the
        secret) and keeps no ``rollout_logprobs`` (they were computed under the text before redaction):
        its record is no longer what the model saw, and ``meta``'s ``redacted`` says so. Calls with
        nothing to redact are kept exactly.
        """
        fields = ("messages", "response", "request", "tools")
        data = {k: record[k] for k in fields if k in record}
        self.redactor.scan(data)
        red = self.redactor.apply(data)
        if red == data:
            return record
        tok = self.renderer.tok
        messages = [Message.model_validate(m) for m in red["messages"]]
        text = self.renderer.prompt_text(messages, schemas_to_hf([ToolSchema.model_validate(t) for t in red["tools"]]))
        response = self.redactor.apply(tok.decode(record["response_tokens"], skip_special_tokens=False))
        return record | red | {"context_tokens": tok(text, add_special_tokens=False)["input_ids"],
                               "response_tokens": tok(response, add_special_tokens=False)["input_ids"],
                               "rollout_logprobs": None, "redacted": True}

    def _reply(self, request: Request, out, prompt_len: int, prompt: str) -> tuple[Reply, Message]:
        """The client's reply and the recorded response message, both from the sampled ids (``prompt``: the
        rendered context they follow)."""
        ids = list(out.token_ids)
        body = ids[:-1] if ids and ids[-1] in self.renderer.eot_ids and out.finish_reason != "length" else ids
        text = self.renderer.decode(body)
        prefix = "toolu_" if request.dialect == "anthropic" else "call_"
        calls, content, reasoning, error = ([], text, None, None) if out.finish_reason == "length" else exact_parse(
            self.renderer, self.tool_parser, request.messages, schemas_to_hf(request.tools), text, lambda: new_id(prefix),
            prompt)
        if calls:
            finish = "tool_calls"
            unknown = sorted({c.name for c in calls} - {t.name for t in request.tools})
            error = f"calls tools not offered: {unknown}" if unknown else None
        else:
            finish = "length" if out.finish_reason == "length" else "stop"
        response = Message(id="", role="assistant", content=content, reasoning=reasoning, tool_calls=calls)
        reply = Reply(content=content, tool_calls=calls, finish=finish, input_tokens=prompt_len,
                      output_tokens=len(ids), parse_error=error, reasoning=reasoning)
        return reply, response

    # --- trajectories -----------------------------------------------------------------------------

    def finalize(self, key: str) -> list[Trajectory]:
        """Write a session's trajectories to ``OUT/trajectories.jsonl`` and retire its journal; returns them.
        ``key`` is the session's key (its header value or anonymous id, after ``TAG/`` for a tagged one)."""
        with self._lock:
            session = self.sessions.pop(key, None)
        if session is None:
            return []
        with session.lock:  # after a call in flight, before any that waited for it
            session.closed = True
            session.journal.close()
        return finalize_journal(session.journal.path, self.out)

    def finalize_tag(self, tag: str) -> list[Trajectory]:
        """Finalize every open session of one rollout tag (a harness process that has exited); returns their
        trajectories in the order the sessions started."""
        keys = [s.key for s in list(self.sessions.values()) if s.tag == tag]
        return [t for key in keys for t in self.finalize(key)]

    def finalize_idle(self, idle_s: float) -> int:
        now = time.monotonic()
        idle = [s.key for s in list(self.sessions.values()) if now - s.last_seen >= idle_s and not s.lock.locked()]
        return sum(len(self.finalize(key)) for key in idle)

    def close(self) -> int:
        return sum(len(self.finalize(key)) for key in list(self.sessions))


def finalize_journal(path: Path, out: Path) -> list[Trajectory]:
    """A journal's trajectories appended to ``out/trajectories.jsonl`` (and returned); the journal moves to ``.done``."""
    records, problems = read_journal(path)
    calls = [r for r in records if r.get("kind") == "call"]
    trajectories = build_session(records, calls[0]["session"]) if calls else []
    if trajectories:
        with TrajectoryWriter(out / "trajectories.jsonl", mode="a") as w:
            for t in trajectories:
                t.meta["journal"] = str(path.name)
                if calls[0].get("tag") is not None:
                    t.meta["tag"] = calls[0]["tag"]
                if problems:
                    t.meta["journal_problems"] = problems
                w.write(t)
    path.rename(path.with_suffix(".jsonl.done"))
    return trajectories


def finalize_all(out: str | Path) -> int:
    """Finalize every journal left in ``out/sessions`` (a gateway that was killed); returns the trajectories written."""
    root = Path(out) / "sessions"
    return sum(len(finalize_journal(p, Path(out))) for p in sorted(root.glob("*.jsonl"))) if root.exists() else 0
