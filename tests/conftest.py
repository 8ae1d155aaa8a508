"""Shared fixtures: the offline model kit (tiny tokenizer + tiny models), built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
HARNESS_LOGS = Path(os.environ.get("MEMORYWALKER_FIXTURES", FIXTURES)) / "harness-logs"


@pytest.fixture(scope="session")
def kit_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kit")


@pytest.fixture(scope="session")
def kit(kit_cache):
    """(tokenizer_dir, llama_model_dir) of the default chatml kit (65,536 positions: a real harness's prompt fits)."""
    from memorywalker.modelkit import default_kit

    return default_kit(kit_cache)


@pytest.fixture(scope="session")
def tokenizer(kit):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(kit[0])


@pytest.fixture(scope="session")
def renderer(tokenizer):
    from memorywalker.render import Renderer

    return Renderer(tokenizer)


@pytest.fixture(scope="session")
def qwen2_kit(kit_cache):
    """(tokenizer_dir, qwen2_model_dir): the second tiny architecture."""
    from memorywalker.modelkit import default_kit

    return default_kit(kit_cache, arch="qwen2")


@pytest.fixture(scope="session")
def qwen3_tokenizer(kit_cache):
    """A kit tokenizer whose template drops reasoning before the last user turn, like Qwen3's."""
    from transformers import AutoTokenizer

    from memorywalker.modelkit import build_tokenizer

    return AutoTokenizer.from_pretrained(build_tokenizer(kit_cache / "qwen3-tok", template="qwen3"))


@pytest.fixture(scope="session")
def harness_logs() -> Path:
    if not HARNESS_LOGS.exists():
        pytest.skip(f"shared fixtures not found at {HARNESS_LOGS}")
    return HARNESS_LOGS


def gateway_process(args: list[str], *, port: int, cwd: Path, env: dict | None = None):
    """``memorywalker gateway ARGS`` as a process of its own (``python -m memorywalker``), returned once
    ``port`` on 127.0.0.1 accepts connections; stdout and stderr together in its ``stdout``."""
    import socket
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "memorywalker", "gateway", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120  # importing torch and loading the model: seconds
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the gateway did not start on port {port}:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.25)


def load_script(name: str):
    """The module ``scripts/<name>.py`` (scripts/ is not a package; the tests share its constants and references)."""
    import importlib.util
    import sys

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    sys.path.insert(0, str(scripts))  # a script may import its siblings
    spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def require_harness(harness: str) -> None:
    """Skip the test where the pinned harness binary is not installed (``.ci/run`` installs them)."""
    from memorywalker.gateway.harnesses import find_binary

    try:
        find_binary(harness)
    except FileNotFoundError as e:
        pytest.skip(str(e))
