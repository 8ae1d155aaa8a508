"""The ``vllm serve`` fleet's routing (:class:`~memorywalker.samplers.vllm_server.ServerFleet`), against small
HTTP servers on loopback that answer the completions API the way vLLM does (the real ``vllm serve`` runs
the same fleet in tests/test_vllm_fleet.py): a session stays on one server, new sessions go to the least
loaded, calls are in flight at once, a server that dies takes its sessions down with
``backend_down`` and leaves the others serving, and a fleet with none left says so in one line."""

from __future__ import annotations

import json
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memorywalker.gateway.backends import FleetBackend, Pending, make_backend
from memorywalker.samplers.base import PolicyRequest
from memorywalker.samplers.vllm_server import BackendDown, ServerFleet, serve_command
from memorywalker.samplers.weight_sync import write_shards


class FakeVLLM:
    """A completions endpoint answering token ``self.token`` with logprob −0.5; ``gate`` (a barrier) makes
    each request wait until that many are in flight at once."""

    def __init__(self, token: int, gate: threading.Barrier | None = None):
        fake = self
        self.token, self.gate, self.prompts = token, gate, []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send({"ok": True} if self.path == "/health" else {"weight_version": "default"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.prompts.append(body["prompt"])
                if fake.gate is not None:
                    fake.gate.wait(timeout=30)
                self._send({"choices": [{"text": "x", "finish_reason": "stop", "token_ids": [fake.token],
                                         "logprobs": {"tokens": [f"token_id:{fake.token}"], "token_logprobs": [-0.5]}}]})

            def _send(self, data):
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kill(self):
        self.server.shutdown()
        self.server.server_close()


def request(seed: int = 0) -> PolicyRequest:
    return PolicyRequest(prompt_ids=[1, 2, 3], messages=[], tools=[], purpose="act", call_index=0, seed=seed)


@pytest.fixture
def two():
    servers = [FakeVLLM(10), FakeVLLM(20)]
    yield servers
    for s in servers:
        try:
            s.kill()
        except OSError:
            pass


def test_a_session_stays_on_its_server_and_new_sessions_go_to_the_least_loaded(two):
    """Sessions a, b, c in that order: a → server 0, b → server 1 (0 has one), c → server 0 (1–1, the first);
    a's later calls stay on server 0, b's on 1 (answered tokens 10 and 20)."""
    fleet = ServerFleet([s.url for s in two], model="kit", timeout=30)
    got = {sid: fleet.sample(sid, request()).token_ids for sid in ("a", "b", "c", "a", "b", "a")}
    assert got == {"a": [10], "b": [20], "c": [10]}
    assert (len(two[0].prompts), len(two[1].prompts)) == (4, 2)
    assert [s.sessions for s in fleet.servers] == [2, 1]
    fleet.start()  # a new step: placement starts afresh
    assert fleet.sample("c", request()).token_ids == [10] and fleet.sample("d", request()).token_ids == [20]


def test_calls_of_many_sessions_are_in_flight_at_once():
    """4 sessions on one server whose handler lets no request answer before 4 are in flight: through the
    gateway's fleet backend (no lock) every call returns; a serial backend would wait out the barrier."""
    server = FakeVLLM(7, gate=threading.Barrier(4))
    try:
        backend = FleetBackend(ServerFleet([server.url], model="kit", timeout=30))
        assert backend.concurrent
        out: dict[str, list[int]] = {}

        def call(sid: str):
            out[sid] = backend.sample(Pending(sid, [1, 2], "", [], [], 4, 0)).token_ids

        threads = [threading.Thread(target=call, args=(f"s{k}",)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert out == {f"s{k}": [7] for k in range(4)} and not server.gate.broken
    finally:
        server.kill()


def test_a_dead_server_fails_its_sessions_with_backend_down_and_the_others_go_on(two):
    """Server 0 dies: session a (on it) fails ``backend_down: URL: ...``, and so does every later call of a;
    b (on server 1) goes on, and a new session lands on server 1. Server 1 dies too: one line, every server
    down, naming both."""
    fleet = ServerFleet([s.url for s in two], model="kit", timeout=10)
    fleet.sample("a", request())
    fleet.sample("b", request())
    two[0].kill()
    with pytest.raises(BackendDown, match=f"^backend_down: {two[0].url}: "):
        fleet.sample("a", request())
    with pytest.raises(BackendDown, match=f"^backend_down: {two[0].url}"):
        fleet.sample("a", request())
    assert fleet.sample("b", request()).token_ids == [20] and fleet.sample("new", request()).token_ids == [20]
    assert [s.url for s in fleet.live()] == [two[1].url]
    two[1].kill()
    with pytest.raises(BackendDown):
        fleet.sample("b", request())
    with pytest.raises(BackendDown, match="every vLLM server is down") as e:
        fleet.sample("newer", request())
    assert two[0].url in str(e.value) and two[1].url in str(e.value) and "\n" not in str(e.value)


def test_openai_with_several_urls_is_a_fleet(kit, two):
    from transformers import AutoTokenizer

    from memorywalker.render import Renderer

    renderer = Renderer(AutoTokenizer.from_pretrained(kit[0]))
    backend = make_backend(f"openai:{two[0].url},{two[1].url}", model_dir=None, renderer=renderer, temperature=1.0,
                           upstream_model="kit")
    assert isinstance(backend, FleetBackend) and backend.name == f"openai:{two[0].url},{two[1].url}"
    assert make_backend(f"openai:{two[0].url}", model_dir=None, renderer=renderer, temperature=1.0).concurrent


def test_shards_hold_every_tensor_once_within_the_size_cap(tmp_path):
    """5 tensors of 4,000 bytes (1,000 fp32) under a 0.01 MiB (10,485-byte) cap: 2 per shard, 3 shards;
    a second write replaces the first's shards."""
    import torch
    from safetensors.torch import load_file

    sd = {f"w{k}": torch.full((1000,), float(k)) for k in range(5)}
    assert write_shards(sd, tmp_path, shard_mib=0.01) == 5
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert [sorted(load_file(p)) for p in shards] == [["w0", "w1"], ["w2", "w3"], ["w4"]]
    write_shards({"only": torch.zeros(3)}, tmp_path)
    assert [sorted(load_file(p)) for p in sorted(tmp_path.glob("*.safetensors"))] == [["only"]]


def test_a_tied_lm_head_is_written_under_both_names():
    """A model whose LM head is its embedding (SmolLM2, Qwen2.5-0.5B): both names are written (safetensors
    refuses two names for one storage), each with the embedding's values; the model's own tensor is not
    touched."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    sd = model.state_dict()
    assert sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
    with tempfile.TemporaryDirectory() as d:
        assert write_shards(sd, d) == len(sd)
        (shard,) = Path(d).glob("*.safetensors")
        back = load_file(shard)
    assert torch.equal(back["lm_head.weight"], back["model.embed_tokens.weight"])
    assert torch.equal(back["lm_head.weight"], model.model.embed_tokens.weight)


def test_the_serve_command_carries_the_flags_the_fleet_needs_then_the_users():
    cmd = serve_command("m", port=8000, served_name="kit", args="--tensor-parallel-size 2 --max-logprobs 50")
    for flag in ("--worker-extension-cls", "--return-tokens-as-token-ids", "processed_logprobs", "--served-model-name"):
        assert flag in cmd
    assert cmd[-4:] == ["--tensor-parallel-size", "2", "--max-logprobs", "50"]  # the user's last: they win


@pytest.mark.parametrize(("keys", "message"), [
    ({"rollout_engine": "vllm-server"}, "samples harness sessions (tasks=FILE"),
    ({"vllm_servers": "http://127.0.0.1:1"}, "vllm_servers= needs rollout_engine=vllm-server"),
    ({"off_policy_steps": 1, "tasks": "t.jsonl", "harness": "opencode"}, "off_policy_steps=1 needs rollout_engine=vllm-server"),
    ({"off_policy_steps": 2, "tasks": "t.jsonl", "harness": "opencode", "rollout_engine": "vllm-server"}, "0 (on-policy) or 1"),
    ({"tasks": "t.jsonl", "harness": "opencode", "rollout_engine": "vllm-server", "vllm_serve": 0}, "start at least one"),
    ({"tasks": "t.jsonl", "harness": "opencode", "rollout_engine": "vllm-server", "script": "s.yaml",
      "temperature": 0.7}, "vLLM never tempers: temperature=1"),
    ({"tasks": "t.jsonl", "harness": "opencode", "rollout_engine": "vllm", "script": "s.yaml"}, "rollout_engine=hf"),
    ({"weight_sync": "broadcast"}, "weight_sync=broadcast needs rollout_engine=vllm-server"),
    ({"tasks": "t.jsonl", "harness": "opencode", "rollout_engine": "vllm-server", "weight_sync": "broadcast",
      "weight_sync_dir": "/tmp/w"}, "weight_sync=broadcast writes none"),
    ({"tasks": "t.jsonl", "harness": "opencode", "rollout_engine": "vllm-server", "weight_sync_host": "10.0.0.2"},
     "it needs weight_sync=broadcast"),
    ({"tasks": "t.jsonl", "harness": "opencode", "rollout_engine": "vllm-server", "weight_sync": "nccl"}, "weight_sync"),
])
def test_the_fleets_settings_are_refused_in_one_line_where_they_cannot_work(keys, message):
    from memorywalker.errors import InputError
    from memorywalker.recipes.rl import RLConfig

    with pytest.raises((InputError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        RLConfig(model="m", **keys)


def test_a_session_whose_server_died_fails_as_backend_down_and_its_harness_is_stopped(kit, two, tmp_path):
    """Through the gateway and ``run_sessions`` (what ``rl tasks=`` runs): a harness whose one call finds its
    server dead (502), then waits as a retrying harness would, is stopped at once — not at its 300 s
    deadline — and its session fails ``backend_down: URL: ...``; a session on the live server finishes."""
    from transformers import AutoTokenizer

    from memorywalker.gateway.core import Gateway
    from memorywalker.gateway.rollouts import SessionJob, run_sessions
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.gateway.tasks import HarnessTask
    from memorywalker.render import Renderer

    renderer = Renderer(AutoTokenizer.from_pretrained(kit[0]))
    eot = sorted(renderer.eot_ids)[0]
    for s in two:
        s.token = eot  # an empty reply that ends the turn
    fleet = ServerFleet([s.url for s in two], model="kit", timeout=10)
    gateway = Gateway(renderer, FleetBackend(fleet), tmp_path / "out", model_name="kit", max_positions=2048,
                      max_new_tokens=8)
    one_call = ("import os, sys, time, urllib.request, urllib.error; "
                "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', headers={'Content-Type': "
                "'application/json'}, data=b'{\"model\": \"kit\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}')\n"
                "try:\n    urllib.request.urlopen(req, timeout=60).read()\n"
                "except urllib.error.HTTPError:\n    time.sleep(300)\n")
    (tmp_path / "one_call.py").write_text(one_call)
    harness = f"cmd:{sys.executable} {tmp_path / 'one_call.py'}"
    fleet.server_for("warm")  # server 0 has one session: the next goes to server 1, the one after to server 0
    task = HarnessTask(id="t", prompt="p", verifier="true")
    two[0].kill()
    with BackgroundServer(gateway) as url:
        first = run_sessions(gateway, url, [SessionJob(task, 0, "a")], harness, model="kit", deadline_s=300,
                             workroot=tmp_path / "w")
        second = run_sessions(gateway, url, [SessionJob(task, 1, "b")], harness, model="kit", deadline_s=300,
                              workroot=tmp_path / "w2")
    assert first[0].failed is None and first[0].reward == 1.0  # on server 1
    assert second[0].failed.startswith(f"backend_down: {two[0].url}: ") and second[0].seconds < 60, second[0].failed
