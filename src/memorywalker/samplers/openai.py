"""``openai:URL`` — an OpenAI-compatible completions endpoint (vLLM, SGLang) as a sampler.

The rendered prompt is sent as token ids, and token ids and logprobs come back; see docs/rollouts.md for
the server flags. The HTTP deadline is :mod:`memorywalker.samplers.http`'s.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.schema import Task
from memorywalker.samplers.base import PolicyOutput, PolicyRequest
from memorywalker.samplers.http import ErrorAnswer, post_within


class OpenAIPolicy:
    """Call ``POST {url}/v1/completions`` with the prompt as token ids; read token ids and logprobs back.

    Request fields beyond the OpenAI spec are the vLLM ones (``return_token_ids``,
    ``return_tokens_as_token_ids``, ``skip_special_tokens``); servers ignore fields they do not know.
    Token ids are taken from ``choices[0].token_ids`` (vLLM ``return_token_ids``), else from
    ``logprobs.tokens`` entries of the form ``token_id:N`` (vLLM ``--return-tokens-as-token-ids``).

    A refused or dropped connection, a timeout or a 5xx answer is retried ``retries`` times, waiting
    ``backoff × 2^attempt`` seconds in between; then, like any 4xx answer or a body that is not a
    completion, it raises :class:`EndpointError` naming the URL. ``timeout`` is a deadline for the
    whole request (connecting, the headers and every byte of the body), not for each socket read: a
    server that trickles its answer a byte at a time is cut off when it passes.
    """

    name = "openai"

    def __init__(self, url: str, *, model: str = "default", temperature: float = 1.0, max_new_tokens: int = 256,
                 top_k: int = 5, timeout: float = 120.0, stop_ids: list[int] | None = None, api_key: str | None = None,
                 retries: int = 3, backoff: float = 1.0):
        url = url.rstrip("/")
        self.url = url if url.endswith("/v1") else url + "/v1"
        self.model, self.temperature, self.max_new_tokens = model, temperature, max_new_tokens
        self.top_k, self.timeout, self.stop_ids, self.api_key = top_k, timeout, stop_ids, api_key
        self.retries, self.backoff = retries, backoff

    def start(self, task: Task | None = None) -> None:
        pass

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "model": self.model, "temperature": self.temperature,
                "max_new_tokens": self.max_new_tokens, "top_k": self.top_k}

    def __call__(self, request: PolicyRequest) -> PolicyOutput:
        body = {"model": self.model, "prompt": list(request.prompt_ids),
                "max_tokens": request.max_new_tokens or self.max_new_tokens,
                "temperature": self.temperature, "seed": request.seed, "logprobs": self.top_k,
                "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": False}
        if self.stop_ids is not None:
            body["stop_token_ids"] = list(self.stop_ids)
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.url + "/completions"
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
        for attempt in range(self.retries + 1):
            try:
                raw = post_within(req, self.timeout)
                break
            except ErrorAnswer as e:  # an answer: only a server error is worth retrying
                cause = f"HTTP {e.code} {e.reason}: {e.body[:200].decode('utf-8', 'replace')}"
                if e.code < 500:
                    raise EndpointError(f"{url}: {cause}") from None
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # refused, reset, timed out
                cause = str(getattr(e, "reason", None) or e) or type(e).__name__
                if isinstance(e, TimeoutError) or "timed out" in cause:
                    cause = f"no answer within {self.timeout:g} s (timed out)"
            if attempt == self.retries:
                raise EndpointError(f"{url}: {cause} (after {attempt + 1} attempts)") from None
            time.sleep(self.backoff * 2 ** attempt)
        try:
            return parse_completion(json.loads(raw))
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as e:
            raise EndpointError(f"{url}: not a completions response ({type(e).__name__}: {e})") from None


class EndpointError(ConnectionError):
    """An OpenAI-compatible endpoint failed for good; the message names its URL and the cause."""


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise InputError(f"server returned token {token!r}, not 'token_id:N': start vLLM with "
                         "--return-tokens-as-token-ids or use a server that returns choices[].token_ids")
    return int(token.split(":", 1)[1])


def parse_completion(data: dict[str, Any]) -> PolicyOutput:
    """Token ids, logprobs and top-k of ``choices[0]`` of an OpenAI completions response.

    >>> parse_completion({"choices": [{"text": "hi", "finish_reason": "stop", "token_ids": [5, 2],
    ...     "logprobs": {"tokens": ["token_id:5", "token_id:2"], "token_logprobs": [-0.5, -0.1],
    ...                  "top_logprobs": [{"token_id:5": -0.5}, {"token_id:2": -0.1}]}}]}).token_ids
    [5, 2]
    """
    choice = data["choices"][0]
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:
        ids = [_token_id(t) for t in lp.get("tokens", [])]
    logprobs = lp.get("token_logprobs")
    tops = None
    if lp.get("top_logprobs") is not None:
        tops = [sorted(((_token_id(t), float(v)) for t, v in row.items()), key=lambda x: -x[1])
                for row in lp["top_logprobs"]]
    finish = choice.get("finish_reason") or "stop"
    return PolicyOutput(token_ids=[int(i) for i in ids],
                        logprobs=[float(x) for x in logprobs] if logprobs is not None else None,
                        top_logprobs=tops, finish_reason="length" if finish == "length" else "stop",
                        meta={"server_finish_reason": finish})
