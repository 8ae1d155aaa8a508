"""The ``openai`` policy against local servers (issue 15, failure 5): bounded retries with backoff on a
refused connection, a timeout or a 5xx; the URL in every error; one line from the CLI; no empty output
file. Old code: a 113-line traceback on a refused connection, 2 min then a TimeoutError without the URL
on a silent server, no retries, no timeout option, a 0-byte output file."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.samplers.base import PolicyRequest
from memorywalker.samplers.http import free_port
from memorywalker.samplers.openai import OpenAIPolicy

COMPLETION = {"choices": [{"text": "hi", "finish_reason": "stop", "token_ids": [5, 2],
                           "logprobs": {"tokens": ["token_id:5", "token_id:2"], "token_logprobs": [-0.5, -0.1]}}]}


def request() -> PolicyRequest:
    return PolicyRequest(prompt_ids=[1, 2, 3], messages=[], tools=[], purpose="act", call_index=0, seed=0)


@contextmanager
def serving(answer):
    """A local server whose POST handler is ``answer(handler, body)``; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            answer(self, self.rfile.read(int(self.headers["Content-Length"])))

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def reply(handler, code: int, payload: bytes) -> None:
    handler.send_response(code)
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


@pytest.fixture
def flaky_server():
    """Answers 503 to the first two requests, then a completion; records every request body."""
    bodies: list[dict] = []

    def answer(handler, body):
        bodies.append(json.loads(body))
        reply(handler, *((503, b"overloaded") if len(bodies) <= 2 else (200, json.dumps(COMPLETION).encode())))

    with serving(answer) as url:
        yield url, bodies


def test_5xx_is_retried_with_backoff_then_succeeds(flaky_server):
    url, bodies = flaky_server
    policy = OpenAIPolicy(url, retries=2, backoff=0.05)
    t0 = time.perf_counter()
    out = policy(request())
    assert out.token_ids == [5, 2] and out.logprobs == [-0.5, -0.1]
    assert len(bodies) == 3 and all(b["prompt"] == [1, 2, 3] for b in bodies)
    assert time.perf_counter() - t0 >= 0.05 + 0.1  # backoff 0.05 s, then 0.1 s


def test_5xx_beyond_the_retries_names_the_url(flaky_server):
    url, bodies = flaky_server
    with pytest.raises(ConnectionError, match=rf"^{url}/v1/completions: HTTP 503 .*overloaded \(after 2 attempts\)$"):
        OpenAIPolicy(url, retries=1, backoff=0.01)(request())
    assert len(bodies) == 2


def test_refused_connection_is_retried_and_names_the_url():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ConnectionError, match=rf"^{url}/v1/completions: .*refused.* \(after 3 attempts\)$"):
        OpenAIPolicy(url, retries=2, backoff=0.01)(request())


def test_a_silent_server_times_out_per_request():
    """A server that accepts the connection and never answers: each attempt waits ``timeout`` seconds."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel accepts; nobody ever reads or answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.perf_counter()
        with pytest.raises(ConnectionError, match=rf"^{url}/v1/completions: no answer within 0.2 s \(timed out\) \(after 2 attempts\)$"):
            OpenAIPolicy(url, timeout=0.2, retries=1, backoff=0.01)(request())
        assert 0.4 <= time.perf_counter() - t0 < 5


def test_cli_rollout_against_a_dead_endpoint_is_one_line_and_leaves_no_file(tmp_path, kit):
    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(app, ["rollout", "--suite", "lookup", "--sampler", f"openai:{url}", "--n", "1",
                                   "--tokenizer", str(kit[0]), "-o", str(out), "--request-timeout", "0.5",
                                   "--retries", "0", "--no-progress"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith(f"memorywalker rollout: error: {url}/v1/completions: ")
    assert not out.exists()


# --- issue 27: a deadline for the whole request; ids the tokenizer does not have -------------------------

@pytest.fixture
def trickling_server():
    """Answers every request with ``Content-Length: 100000`` and then one byte a second."""

    def answer(handler, body):
        handler.send_response(200)
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        try:
            for _ in range(100):
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(1)
        except OSError:  # the client hung up: its deadline passed
            pass

    with serving(answer) as url:
        yield url


def test_request_timeout_is_a_deadline_for_the_whole_answer(trickling_server):
    """Old code: urllib's timeout bounded each socket read, so a server sending a byte a second never
    let the request return. Now the 1.5 s deadline covers connecting, the headers and the body: two
    attempts end in about 3 s (+ the 0.01 s backoff), far from the 100 s the server would take."""
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match=rf"^{trickling_server}/v1/completions: no answer within 1.5 s "
                                              r"\(timed out\) \(after 2 attempts\)$"):
        OpenAIPolicy(trickling_server, timeout=1.5, retries=1, backoff=0.01)(request())
    assert 3.0 <= time.perf_counter() - t0 < 10


def test_cli_rollout_against_a_trickling_server_returns(trickling_server, tmp_path, kit):
    out = tmp_path / "r.jsonl"
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["rollout", "--suite", "lookup", "--sampler", f"openai:{trickling_server}", "--n", "1",
                                   "--tokenizer", str(kit[0]), "-o", str(out), "--request-timeout", "1",
                                   "--retries", "0", "--no-progress"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0] == (f"memorywalker rollout: error: {trickling_server}/v1/completions: no answer within 1 s "
                        "(timed out) (after 1 attempts)")
    assert time.perf_counter() - t0 < 10 and not out.exists()


@pytest.fixture
def foreign_vocab_server():
    """A completion whose token ids belong to another (bigger) tokenizer."""
    payload = json.dumps({"choices": [{"text": "x", "finish_reason": "stop", "token_ids": [5, 10**6],
                                       "logprobs": {"token_logprobs": [-0.5, -0.1]}}]}).encode()
    with serving(lambda handler, body: reply(handler, 200, payload)) as url:
        yield url


def test_cli_rollout_refuses_ids_the_tokenizer_does_not_have(foreign_vocab_server, tmp_path, kit, tokenizer):
    """Old code wrote the ids with exit 0 (training on them then crashed). Now the first such answer
    stops the run with one line naming the id and the vocabulary size; nothing is written."""
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(app, ["rollout", "--suite", "lookup", "--sampler", f"openai:{foreign_vocab_server}", "--n", "1",
                                   "--tokenizer", str(kit[0]), "-o", str(out), "--retries", "0", "--no-progress"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("memorywalker rollout: error: ")
    assert (f"token_out_of_vocab: policy openai returned token id 1000000, which the tokenizer does not have "
            f"(vocab size {len(tokenizer)}): is --tokenizer the served model's?") in lines[0]
    assert not out.exists()
