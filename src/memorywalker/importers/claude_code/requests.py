"""Claude Code's request log (2.1.3xx): the exact messages of every API request, from the log itself.

Next to the conversation records, Claude Code writes

* ``api-request-shape`` ``{shapeHash, shape: {system, tools}}``: the system blocks (without the
  ``x-anthropic-billing-header`` block) and the tools sent;
* ``api-request-blob`` ``{hash, message}``: one API message ``{role, content}``;
* ``api-request`` ``{id, base, keep, tail, shapeHash, params, cacheControl, requestDigest}``: the
  request's messages are the first ``keep`` messages of request ``base`` followed by the messages
  whose hashes ``tail`` lists; a request after a compaction restarts the chain (``base`` null,
  ``keep`` 0). An assistant record names its request in ``requestRef``.

A message's hash is ``sha256`` of its JSON with sorted keys and no spaces, its content as blocks (a
string content is one text block). A message that is a conversation record as written (an assistant
response, a user record) gets no blob: it is found by hashing the records the same way.

``requestDigest`` is ``sha256`` of the same JSON of ``{**params, system, tools, messages}`` with each
``cacheControl`` ``{path, value}`` set as ``cache_control`` at its path (messages as blocks): verified
per request (:meth:`RequestLog.resolve`). This was found on Claude Code 2.1.328's own logs and held
for every request of them (tests/data/claude_code_truth/).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

KINDS = ("api-request", "api-request-blob", "api-request-shape")


def digest(obj: Any) -> str:
    """Claude Code's hash of a message, shape or request: sha256 of sorted, compact JSON.

    >>> digest({"b": 1, "a": "é"})[:12]
    'aa58fba84836'
    """
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode()).hexdigest()


def as_blocks(message: dict) -> dict:
    """``{role, content}`` with a string content as one text block (the form Claude Code hashes)."""
    content = message.get("content")
    return {"role": message.get("role"),
            "content": [{"type": "text", "text": content}] if isinstance(content, str) else content}


@dataclass
class Resolved:
    """One request's messages (``None`` where a hash is unknown) and how its digest compares."""

    system: list[dict]
    tools: list[dict]
    hashes: list[str]
    messages: list[dict | None]
    digest: str  # "match" | "mismatch" | "unverified" (a message or the shape is missing)

    @property
    def complete(self) -> bool:
        return all(m is not None for m in self.messages)


@dataclass
class RequestLog:
    shapes: dict[str, dict] = field(default_factory=dict)
    messages: dict[str, dict] = field(default_factory=dict)  # hash -> API message (blobs and records)
    requests: dict[str, dict] = field(default_factory=dict)
    _cache: dict[str, list[str] | None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.requests)

    def add(self, obj: dict) -> str | None:
        """Keep one request-log record; return why it is unusable (None when it is kept)."""
        kind = obj.get("type")
        if kind == "api-request-shape":
            if not isinstance(obj.get("shapeHash"), str) or not isinstance(obj.get("shape"), dict):
                return "api-request-shape without shapeHash or shape"
            self.shapes[obj["shapeHash"]] = obj["shape"]
        elif kind == "api-request-blob":
            if not isinstance(obj.get("hash"), str) or not isinstance(obj.get("message"), dict):
                return "api-request-blob without hash or message"
            self.messages[obj["hash"]] = obj["message"]
        else:
            tail = obj.get("tail")
            if not isinstance(obj.get("id"), str) or not isinstance(tail, list) or not all(isinstance(t, str) for t in tail):
                return "api-request without id or tail"
            if not isinstance(obj.get("keep", 0), int) or not isinstance(obj.get("base"), str | None):
                return "api-request whose keep or base has the wrong type"
            self.requests[obj["id"]] = obj
        return None

    def add_message(self, message: dict) -> None:
        """A message written as a conversation record (found by its hash when no blob holds it)."""
        self.messages.setdefault(digest(as_blocks(message)), message)

    def hashes(self, request_id: str, depth: int = 0) -> list[str] | None:
        """The message hashes of a request, following ``base``; None when the chain is broken."""
        if request_id in self._cache:
            return self._cache[request_id]
        req = self.requests.get(request_id)
        out: list[str] | None = None
        if req is not None and depth < 10_000:
            keep, base = req.get("keep") or 0, req.get("base")
            prefix = self.hashes(base, depth + 1) if base else []
            if prefix is not None and len(prefix) >= keep:
                out = prefix[:keep] + list(req["tail"])
        self._cache[request_id] = out
        return out

    def resolve(self, request_id: str) -> Resolved | None:
        hashes = self.hashes(request_id)
        if hashes is None:
            return None
        req = self.requests[request_id]
        shape = self.shapes.get(req.get("shapeHash"))
        messages = [self.messages.get(h) for h in hashes]
        system = _blocks((shape or {}).get("system"))
        tools = [t for t in (shape or {}).get("tools") or [] if isinstance(t, dict)]
        state = "unverified"
        if shape is not None and all(m is not None for m in messages) and isinstance(req.get("requestDigest"), str):
            state = "match" if self.request_digest(req, shape, messages) == req["requestDigest"] else "mismatch"
        return Resolved(system, tools, hashes, messages, state)

    @staticmethod
    def request_digest(req: dict, shape: dict, messages: list) -> str | None:
        params = req.get("params") if isinstance(req.get("params"), dict) else {}
        body = copy.deepcopy({**params, **shape, "messages": [as_blocks(m) for m in messages]})
        for cc in req.get("cacheControl") or []:
            try:
                *path, last = cc["path"]
                node = body
                for p in path:
                    node = node[p]
                node[last]["cache_control"] = cc["value"]
            except (KeyError, IndexError, TypeError, ValueError):
                return None
        return digest(body)


def _blocks(system: Any) -> list[dict]:
    if isinstance(system, str):
        return [{"type": "text", "text": system}]
    return [b for b in system if isinstance(b, dict)] if isinstance(system, list) else []
