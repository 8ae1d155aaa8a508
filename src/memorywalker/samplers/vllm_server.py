"""A fleet of ``vllm serve`` processes as one sampler, and the trainer's weights pushed to every server.

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL_DIR --worker-extension-cls \\
        memorywalker.samplers.vllm_worker.WeightSyncExtension --return-tokens-as-token-ids \\
        --logprobs-mode processed_logprobs --generation-config vllm --served-model-name NAME [your args]
    memorywalker rl tasks=FILE harness=opencode rollout_engine=vllm-server vllm_servers=URL[,URL...] ...

**Sampling.** :class:`ServerFleet` sends each call to one server through the completions API with the
prompt as token ids (:class:`~memorywalker.samplers.openai.OpenAIPolicy`). A session is pinned to the
server that answered its first call, so its growing prompt hits that server's prefix cache; a new
session goes to the live server with the fewest sessions. Calls are not serialized here: every session
has its calls in flight at once, and vLLM batches them. A server that stops answering (refused, reset,
its ``/health`` gone) is **down**: the call fails with :class:`BackendDown` (``backend_down: URL: cause``),
so do later calls of the sessions pinned to it; new sessions go to the servers left, and when none is
left every call fails the same way.

**Weight sync** (:meth:`ServerFleet.sync_weights`, :meth:`ServerFleet.broadcast_weights`), through vLLM's
own routes for it (the server's development API, ``VLLM_SERVER_DEV_MODE=1``): every live server is paused
(``POST /pause?mode=wait``: calls in flight finish under the old weights), its workers take the weights
(``POST /collective_rpc`` → :class:`~memorywalker.samplers.vllm_worker.WeightSyncExtension` on every
worker of every server at once: vLLM's in-place ``reload_weights``, which fuses and shards as the
server's own load does) either from safetensors shards in a directory every server reads or by a
broadcast from the trainer (:mod:`~memorywalker.samplers.weight_sync`), its prefix cache is reset (its
keys/values are the old weights'), its ``weight_version`` set, and it resumes. Each worker must report
the tensors it took; anything else raises :class:`SyncError`. :meth:`ServerFleet.check_sync` is the
proof: the prompt logprobs every server returns for a probe equal the trainer's own forward of the new
weights.

:func:`start_servers` starts the fleet itself (``vllm_serve_args``: the user's own vLLM arguments,
tensor and data parallelism included) with the flags above, and stops it when the run ends.
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memorywalker.records.schema import Task
from memorywalker.samplers.base import PolicyOutput, PolicyRequest
from memorywalker.samplers.http import ErrorAnswer, free_port, post_within
from memorywalker.samplers.openai import EndpointError, OpenAIPolicy
from memorywalker.samplers.vllm import EXTENSION  # the in-process engine's worker extension: the same route

# What every server of a fleet must be started with (start_servers adds them; docs/harness-rl.md "At scale")
REQUIRED_FLAGS = ["--worker-extension-cls", EXTENSION, "--return-tokens-as-token-ids",
                  "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm", "--max-logprobs", "20"]
STARTUP_S = 600.0


class BackendDown(ConnectionError):
    """A server of the fleet is gone (or none is left); the message starts with ``backend_down:``."""


class SyncError(ConnectionError):
    """The weights did not reach a server (or it serves others than the trainer's): the run stops here,
    before anything samples from stale weights (the CLI's one line, exit 2, as for a server it cannot reach)."""


@dataclass
class Server:
    url: str
    policy: OpenAIPolicy
    sessions: int = 0  # sessions pinned to it since the last reset
    down: str | None = None  # why it is gone, once it is


@dataclass
class ServerFleet:
    """``vllm serve`` processes at ``urls`` serving ``model`` (its ``--served-model-name``); see the module
    docstring. ``timeout``: seconds one completion may take."""

    urls: list[str]
    model: str
    temperature: float = 1.0
    max_new_tokens: int = 256
    stop_ids: list[int] | None = None
    timeout: float = 600.0
    top_k: int = 5
    servers: list[Server] = field(init=False)
    _pinned: dict[str, Server] = field(init=False, default_factory=dict)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _broadcast: Any = field(init=False, default=None)  # the weight-broadcast group, once formed

    name = "vllm-server"

    def __post_init__(self):
        if not self.urls:
            raise ValueError("a fleet needs at least one server URL")
        self.servers = [Server(u.rstrip("/").removesuffix("/v1"), OpenAIPolicy(
            u, model=self.model, temperature=self.temperature, max_new_tokens=self.max_new_tokens, top_k=self.top_k,
            timeout=self.timeout, stop_ids=self.stop_ids, retries=0)) for u in self.urls]

    # --- sampling ---------------------------------------------------------------------------------------

    def live(self) -> list[Server]:
        return [s for s in self.servers if s.down is None]

    def _none_left(self) -> BackendDown:
        return BackendDown(f"backend_down: every vLLM server is down ({self.why_down()})")

    def server_for(self, session: str) -> Server:
        """The server ``session`` is pinned to (a new session: the live one with the fewest sessions)."""
        with self._lock:
            server = self._pinned.get(session)
            if server is None:
                live = self.live()
                if not live:
                    raise self._none_left()
                server = min(live, key=lambda s: s.sessions)
                server.sessions += 1
                self._pinned[session] = server
        if server.down is not None:
            raise BackendDown(f"backend_down: {server.url}: {server.down}")
        return server

    def sample(self, session: str, request: PolicyRequest) -> PolicyOutput:
        server = self.server_for(session)
        try:
            return server.policy(request)
        except EndpointError as e:
            if _healthy(server.url):
                raise  # the call failed, the server is up (a bad request, a timeout): not a dead server
            with self._lock:
                server.down = server.down or " ".join(str(e).split())[:300]
            raise BackendDown(f"backend_down: {server.url}: {server.down}") from None

    def __call__(self, request: PolicyRequest) -> PolicyOutput:  # the Policy protocol: one anonymous session
        return self.sample(f"call-{request.seed}", request)

    def start(self, task: Task | None = None) -> None:
        """A new step: sessions are placed afresh (a session id is never reused across steps)."""
        with self._lock:
            self._pinned.clear()
            for s in self.servers:
                s.sessions = 0

    def mark_down(self, url: str, why: str) -> None:
        """Take the server at ``url`` out of the fleet (another rank found it gone)."""
        with self._lock:
            for s in self.servers:
                if s.url == url and s.down is None:
                    s.down = why

    def why_down(self) -> str:
        return "; ".join(f"{s.url}: {s.down}" for s in self.servers if s.down is not None) or "none is down"

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "urls": [s.url for s in self.servers], "model": self.model,
                "temperature": self.temperature, "max_new_tokens": self.max_new_tokens, "top_k": self.top_k}

    # --- weight sync ------------------------------------------------------------------------------------

    def check_ready(self) -> None:
        """Every server answers and exposes the development API the sync needs; else one line saying how
        to start it."""
        for s in self.servers:
            try:
                _get(s.url + "/weight_info", 10)
            except ErrorAnswer as e:
                raise SyncError(f"{s.url}: no weight-sync route (GET /weight_info: HTTP {e.code}): start vllm serve "
                                f"with VLLM_SERVER_DEV_MODE=1 and {' '.join(REQUIRED_FLAGS)}") from None
            except (OSError, http.client.HTTPException) as e:
                raise BackendDown(f"backend_down: {s.url}: {_cause(e)}") from None

    def sync_weights(self, path: str | Path, version: str, *, expect: int | None = None) -> float:
        """Every live server loads the safetensors file or shard directory ``path`` and serves it as
        ``version``; seconds taken. ``expect``: the tensors each worker must report reading."""
        return self._sync(version, expect, lambda live: self.rpc(live, "memorywalker_load_weights", lambda s: [str(path)]))

    def broadcast_weights(self, weights: dict, version: str, *, host: str) -> float:
        """Every live server receives ``weights`` (names → tensors) by a broadcast from this process
        (:class:`~memorywalker.samplers.weight_sync.WeightBroadcast`, its group formed on the first
        sync and again whenever the live servers changed; ``host``: this machine's address as the servers
        reach it) and serves them as ``version``; seconds taken."""
        from memorywalker.samplers.weight_sync import WeightBroadcast  # lazy: loads torch

        if self._broadcast is None:
            self._broadcast = WeightBroadcast(host, timeout=self.timeout)
        return self._sync(version, len(weights), lambda live: self._broadcast.send(self, live, weights))

    def _sync(self, version: str, expect: int | None, load) -> float:
        """Pause every live server (calls in flight finish under the old weights), ``load(live)`` (url →
        the collective RPC's answer: each worker's tensor count), reset their prefix caches (the cached
        keys/values are the old weights'), set ``version``, resume them."""
        t0 = time.perf_counter()
        for s in self.live():
            if not _healthy(s.url):  # died since its last call: the others go on without it
                self.mark_down(s.url, "its /health stopped answering")
        live = self.live()
        if not live:
            raise self._none_left()
        paused = []
        try:
            for s in live:
                _guarded(s.url, _post, s.url + "/pause?mode=wait", {}, self.timeout)
                paused.append(s)
            for url, answer in load(live).items():
                # the route answers each worker's count as text: one per worker, each the tensors loaded
                counts = [int(c) if str(c).isdigit() else None for c in (answer or {}).get("results") or []]
                if not counts or None in counts or (expect is not None and set(counts) != {expect}):
                    raise SyncError(f"{url}: the workers answered {counts!r} to the weight load "
                                    f"(expected {expect if expect is not None else 'a tensor count'} each)")
            for s in live:
                _guarded(s.url, _post, s.url + "/reset_prefix_cache", None, 60)
                _guarded(s.url, _post, s.url + "/update_weight_version", {"new_version": version}, 60)
        finally:
            for s in paused:
                try:
                    _post(s.url + "/resume", {}, 60)
                except (ErrorAnswer, OSError, http.client.HTTPException) as e:  # paused for good: out of the fleet
                    self.mark_down(s.url, f"it did not resume after the weight sync: {_cause(e)}")
        return time.perf_counter() - t0

    def rpc(self, servers: list[Server], method: str, args_of, *, beside=None) -> dict[str, Any]:
        """``POST /collective_rpc`` of ``method`` (the worker extension's; ``args_of(server)``: its string
        arguments) to every server of ``servers`` at once, ``beside()`` running here meanwhile (the
        broadcast's sending side); url → answer. The first failure raises, without waiting for the rest:
        a server's, or a ``torch.distributed`` error here, as :class:`SyncError`; anything else as itself."""
        answers: dict[str, Any] = {}
        failed: list[BaseException] = []

        def call(s: Server) -> None:
            try:
                answers[s.url] = _guarded(s.url, _post, s.url + "/collective_rpc",
                                          {"method": method, "args": args_of(s), "timeout": self.timeout}, self.timeout)
            except ValueError as e:  # an answer that is not JSON (JSONDecodeError): the server's fault
                failed.append(SyncError(f"{s.url}: weight sync failed: {_cause(e)}"))
            except BaseException as e:  # noqa: BLE001 - SyncError as it is; anything else raised as itself, below
                failed.append(e)

        def here() -> None:
            try:
                beside()
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread, below
                failed.append(e)

        threads = [threading.Thread(target=call, args=(s,), daemon=True) for s in servers]
        threads += [threading.Thread(target=here, daemon=True)] if beside is not None else []
        for t in threads:
            t.start()
        while not failed and any(t.is_alive() for t in threads):
            time.sleep(0.02)
        if failed:
            e = failed[0]
            if isinstance(e, (RuntimeError, OSError)) and not isinstance(e, SyncError):  # torch.distributed's
                raise SyncError(f"weight sync failed in the trainer: {_cause(e)}") from e
            raise e
        missing = [s.url for s in servers if s.url not in answers]
        if missing:  # never a sync that counts a server it did not hear from
            raise SyncError(f"{missing[0]}: no answer to the weight load")
        return answers

    def world_size(self, server: Server) -> int:
        """How many workers ``server`` runs (tensor × pipeline × data parallel)."""
        return int(json.loads(_guarded(server.url, _get, server.url + "/get_world_size", 30))["world_size"])

    def served_versions(self) -> dict[str, str]:
        """url → the ``weight_version`` each live server reports."""
        return {s.url: json.loads(_get(s.url + "/weight_info", 10))["weight_version"] for s in self.live()}

    def prompt_logprobs(self, url: str, prompt: list[int]) -> list[float]:
        """log p(prompt[i] | prompt[:i]) for i ≥ 1 as the server at ``url`` computes them, untempered (the
        check that a sync took)."""
        body = {"model": self.model, "prompt": list(prompt), "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": 0, "return_tokens_as_token_ids": True}
        rows = _post(url + "/v1/completions", body, self.timeout)["choices"][0]["prompt_logprobs"]
        return [float(rows[i][str(t)]["logprob"]) for i, t in enumerate(prompt) if i > 0]

    def score(self, prompt: list[int], response: list[int]) -> list[float]:
        """Teacher-forced logprobs of ``response`` after ``prompt`` on a live server (a scripted session's
        rollout logprobs). vLLM's prompt logprobs are untempered whatever the request's temperature, so this
        is exact only at temperature 1 (the config refuses a script at any other)."""
        if not response:
            return []
        live = self.live()
        if not live:
            raise self._none_left()
        return self.prompt_logprobs(live[0].url, list(prompt) + list(response))[len(prompt) - 1:]

    def check_sync(self, prompt: list[int], expected: list[float], *, tol: float) -> float:
        """The largest |Δ logp| over live servers between their prompt logprobs of ``prompt`` and
        ``expected`` (the trainer's forward of the weights just synced); :class:`SyncError` above ``tol``."""
        worst = 0.0
        for s in self.live():
            got = self.prompt_logprobs(s.url, prompt)
            diff = max((abs(a - b) for a, b in zip(got, expected, strict=True)), default=0.0)
            if diff > tol:
                raise SyncError(f"{s.url} does not serve the trainer's weights after the sync: max |Δ logp| "
                                f"{diff:.3g} > {tol:g} on a {len(prompt)}-token probe")
            worst = max(worst, diff)
        return worst


def _guarded(url: str, fn, *args):
    """``fn(*args)``, a failure raised as :class:`SyncError` naming ``url``."""
    try:
        return fn(*args)
    except ErrorAnswer as e:
        raise SyncError(f"{url}: weight sync failed: HTTP {e.code}: "
                        f"{' '.join(e.body.decode('utf-8', 'replace').split())[:300]}") from None
    except (OSError, http.client.HTTPException) as e:
        raise SyncError(f"{url}: weight sync failed: {_cause(e)}") from None


def _cause(e: BaseException) -> str:
    return " ".join((str(getattr(e, "reason", None) or e) or type(e).__name__).split())[:300]


def _post(url: str, body: Any, timeout: float) -> Any:
    data = b"" if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    raw = post_within(req, timeout)
    return json.loads(raw) if raw.strip() else None


def _get(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        raise ErrorAnswer(e.code, str(e.reason), e.read()) from None


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status == 200
    except (OSError, http.client.HTTPException):
        return False


# --- starting a fleet ---------------------------------------------------------------------------------

def serve_command(model_dir: str, *, port: int, served_name: str, tokenizer: str | None = None, dtype: str = "float32",
                  max_model_len: int | None = None, args: str = "", python: str | None = None) -> list[str]:
    """The ``vllm serve`` command line of one server of a fleet: :data:`REQUIRED_FLAGS`, then ``args``
    (the user's own, shell-split: tensor/data parallelism, memory, CPU flags) which may override the rest."""
    cmd = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_name, "--dtype", dtype,
           *REQUIRED_FLAGS]
    if tokenizer:
        cmd += ["--tokenizer", str(tokenizer)]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    return cmd + shlex.split(args)


@contextmanager
def start_servers(model_dir: str, count: int, *, log_dir: Path, served_name: str, tokenizer: str | None = None,
                  dtype: str = "float32", max_model_len: int | None = None, args: str = "", python: str | None = None,
                  startup_s: float = STARTUP_S, env: list[dict[str, str]] | None = None, log=print):
    """Start ``count`` ``vllm serve`` processes on free loopback ports (logs in ``log_dir/server-I.log``);
    yields their URLs once every ``/health`` answers, stops them (their process groups) on exit. A server
    that exits or is not up within ``startup_s`` raises :class:`BackendDown` with its log's last line.
    ``env``: per server, variables added to its environment (``CUDA_VISIBLE_DEVICES``: its GPUs)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    base = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    procs: list[tuple[subprocess.Popen, str, Path]] = []
    try:
        for i in range(count):
            port, path = free_port(), log_dir / f"server-{i}.log"
            cmd = serve_command(model_dir, port=port, served_name=served_name, tokenizer=tokenizer, dtype=dtype,
                                max_model_len=max_model_len, args=args, python=python)
            with open(path, "wb") as out:
                procs.append((subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**base, **(env or [{}] * count)[i]},
                                               start_new_session=True), f"http://127.0.0.1:{port}", path))
            log(f"rl: vllm serve {i} starting on 127.0.0.1:{port} (log: {path})")
        deadline = time.monotonic() + startup_s
        for proc, url, path in procs:
            while not _healthy(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    last = (path.read_text(errors="replace").strip().splitlines() or ["(empty log)"])[-1]
                    why = f"exited {proc.returncode}" if proc.returncode is not None else f"not up after {startup_s:g} s"
                    raise BackendDown(f"backend_down: vllm serve ({url}) {why}: {last[:300]} (log: {path})")
                time.sleep(1.0)
        yield [url for _, url, _ in procs]
    finally:
        for proc, _, _ in procs:
            stop_process(proc)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL after 30 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass
