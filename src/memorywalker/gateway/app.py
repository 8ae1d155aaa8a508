"""The gateway's HTTP face (Starlette on uvicorn): routes, errors in each dialect's shape, streaming.

Routes: ``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic), ``POST /v1/responses``
(OpenAI Responses), ``POST /v1/chat/completions`` (OpenAI Chat), ``GET /v1/models``, ``GET /health``;
the same under ``/r/TAG/`` tags the sessions of those calls (one RL rollout's harness process).
A call is sampled in a worker thread (the event loop keeps serving other sessions) and journaled
before its first byte is sent; a client that disconnects mid-stream leaves the call recorded, with an
``undelivered`` note. Statuses: 400 malformed request (not JSON, nested too deeply to parse, a field of the wrong type,
a response cap below 1, a negative temperature) or a prompt longer than the model's positions
("prompt is too long: N tokens > M maximum", as the providers' APIs say it), 401 wrong key, 413 a body
over the size limit, 502 backend failed or answered garbage, 504 backend too slow.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from types import ModuleType
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from memorywalker.gateway import anthropic, chat, responses
from memorywalker.gateway.core import Gateway
from memorywalker.gateway.dialect import BadRequest
from memorywalker.samplers.openai import EndpointError

# The header each harness names its session with (Claude Code, Codex, OpenCode), then common ones.
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "session_id", "x-session-id", "conversation-id")
MAX_BODY = 64 << 20
log = logging.getLogger("memorywalker.gateway")


class UpstreamError(Exception):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _upstream(e: BaseException) -> UpstreamError:
    text = " ".join(str(e).split()) or type(e).__name__
    return UpstreamError(f"the backend failed: {text}", 504 if "timed out" in text else 502)


def create_app(gateway: Gateway, *, api_key: str | None = None, on_call=None) -> Starlette:
    """The ASGI app serving ``gateway``; ``on_call(record)`` runs after each recorded call (the live table)."""

    def authorized(req: HTTPRequest) -> bool:
        if api_key is None:
            return True
        given = req.headers.get("x-api-key") or req.headers.get("authorization", "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), api_key.encode())  # no timing hint about the key

    async def body_of(req: HTTPRequest, dialect: ModuleType) -> Any:
        declared = req.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:  # refused before it is read
            raise BadRequest(f"the request body is {declared} bytes, over the gateway's size limit of {MAX_BODY}", 413)
        raw = await req.body()
        if len(raw) > MAX_BODY:
            raise BadRequest(f"the request body is {len(raw)} bytes, over the gateway's size limit of {MAX_BODY}", 413)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"the request body is not JSON: {e}") from None
        except RecursionError:  # the parser's stack, not the gateway's: a body nested thousands deep
            raise BadRequest("the request body nests too deeply to parse (no API request does)") from None

    def error(dialect: ModuleType, status: int, message: str) -> JSONResponse:
        gateway.stats["errors"] += 1
        return JSONResponse(dialect.error_json(status, message), status_code=status)

    def endpoint(dialect: ModuleType):
        async def handle(req: HTTPRequest) -> Response:
            if not authorized(req):
                return error(dialect, 401, "invalid API key")
            try:
                body = await body_of(req, dialect)
                request = dialect.parse(body)
                header = next(((h, req.headers[h]) for h in SESSION_HEADERS if req.headers.get(h)), None)
                tag = req.path_params.get("tag")
                reply, record = await anyio.to_thread.run_sync(_serve, gateway, request, header, body, tag)
            except BadRequest as e:
                return error(dialect, e.status, str(e))
            except UpstreamError as e:
                return error(dialect, e.status, str(e))
            except Exception as e:  # noqa: BLE001 — a bug: the client gets its dialect's 500, the log the traceback
                log.exception("gateway: a call failed")
                return error(dialect, 500, f"internal error in the gateway: {type(e).__name__}: {e}")
            if on_call is not None:
                on_call(record)
            if not request.stream:
                return JSONResponse(dialect.reply_json(reply, request))
            return StreamingResponse(_stream(gateway, dialect, reply, request, record), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return handle

    async def count_tokens(req: HTTPRequest) -> Response:
        if not authorized(req):
            return error(anthropic, 401, "invalid API key")
        try:
            body = await body_of(req, anthropic)
            if isinstance(body, dict):
                body.setdefault("max_tokens", 1)
            request = anthropic.parse(body)
            n = await anyio.to_thread.run_sync(gateway.count_tokens, request)
        except BadRequest as e:
            return error(anthropic, e.status, str(e))
        return JSONResponse({"input_tokens": n})

    async def models(req: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": gateway.model_name, "object": "model", "type": "model", "created": 0, "owned_by": "memorywalker",
            "display_name": gateway.model_name, "max_model_len": gateway.max_positions}]})

    async def health(req: HTTPRequest) -> Response:
        return JSONResponse({"ok": True, **gateway.stats, "open_sessions": len(gateway.sessions)})

    api = [
        Route("/v1/messages", endpoint(anthropic), methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", endpoint(responses), methods=["POST"]),
        Route("/v1/chat/completions", endpoint(chat), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ]
    # /r/TAG/v1/...: the same API, its sessions tagged TAG (one harness process of an RL step: base URL .../r/TAG)
    return Starlette(routes=[*api, Mount("/r/{tag}", routes=api), Route("/health", health, methods=["GET"])])


def _serve(gateway: Gateway, request, header, body, tag):
    try:
        return gateway.serve(request, header, body, tag)
    except (EndpointError, ConnectionError, TimeoutError) as e:  # the backend, not the request
        raise _upstream(e) from None


async def _stream(gateway: Gateway, dialect: ModuleType, reply, request, record):
    """The reply's SSE events; a client gone before the last one is noted in the session's journal."""
    done = False
    try:
        for event in dialect.reply_events(reply, request):
            yield event
        done = True
    finally:
        if not done:
            session = next((s for s in list(gateway.sessions.values()) if s.id == record["session"]), None)
            if session is not None:
                session.journal.append({"kind": "undelivered", "call": record["id"], "time": time.time(),
                                        "reason": "the client disconnected mid-stream"})
