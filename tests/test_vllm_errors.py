"""Which failures of the ``vllm`` sampler are the engine's (an :class:`EngineError`: one line, exit 2 like
an unreachable endpoint) and which are ours (a ``TypeError`` / ``AttributeError`` from a bad argument:
raised as what it is, so the CLI reports a bug with its traceback). No engine starts: ``vllm`` is a
stand-in module whose ``LLM`` raises what vLLM would, so this runs in the default suite."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from memorywalker.samplers.vllm import EngineError, VLLMPolicy


class _Core:
    pass  # no engine processes to watch (as with VLLM_ENABLE_V1_MULTIPROCESSING=0)


@pytest.fixture
def fake_vllm(monkeypatch):
    """A ``vllm`` module whose ``LLM(**kwargs)`` raises ``state["start"]`` (if set) and whose ``generate``
    raises ``state["generate"]`` (if set); ``state["kwargs"]`` records what the engine was given."""
    state: dict = {}

    class LLM:
        def __init__(self, **kwargs):
            state["kwargs"] = kwargs
            if state.get("start") is not None:
                raise state["start"]
            self.llm_engine = types.SimpleNamespace(engine_core=_Core())

        def generate(self, prompts, params, use_tqdm=False):
            raise state["generate"]

    vllm = types.ModuleType("vllm")
    vllm.LLM = LLM
    vllm.SamplingParams = lambda **kw: kw
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: False)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    for name, module in (("vllm", vllm), ("vllm.platforms", platforms), ("vllm.inputs", inputs)):
        monkeypatch.setitem(sys.modules, name, module)
    return state


def test_a_bad_engine_argument_is_a_type_error_not_an_unreachable_engine(fake_vllm, kit, tokenizer):
    """``kv_cache_gb=1`` (a typo of ``kv_cache_gib``) goes to ``vllm.LLM`` through ``engine_kwargs``; the
    ``TypeError`` it raises comes out unchanged. Before, it became "could not start an engine" (exit 2)."""
    fake_vllm["start"] = TypeError("LLM.__init__() got an unexpected keyword argument 'kv_cache_gb'")
    with pytest.raises(TypeError, match="unexpected keyword argument 'kv_cache_gb'") as err:
        VLLMPolicy(kit[1], tokenizer=tokenizer, kv_cache_gb=1)
    assert not isinstance(err.value, EngineError) and fake_vllm["kwargs"]["kv_cache_gb"] == 1


def test_an_engine_that_fails_to_start_is_one_line(fake_vllm, kit, tokenizer):
    fake_vllm["start"] = RuntimeError("Engine core initialization failed.\nSee root cause above.")
    with pytest.raises(EngineError) as err:
        VLLMPolicy(kit[1], tokenizer=tokenizer)
    assert str(err.value) == (f"vllm could not start an engine for {kit[1]}: RuntimeError: Engine core "
                              "initialization failed. See root cause above.")


def test_generate_reports_engine_failures_and_raises_programming_errors(fake_vllm, kit, tokenizer):
    """A dead engine (vLLM's ``EngineDeadError``, an ``Exception``) is an :class:`EngineError`; an
    ``AttributeError`` inside ``generate`` is raised as itself."""
    policy = VLLMPolicy(kit[1], tokenizer=tokenizer)

    class EngineDeadError(Exception):
        pass

    fake_vllm["generate"] = EngineDeadError("EngineCore encountered an issue.")
    with pytest.raises(EngineError, match=r"failed: EngineDeadError: EngineCore encountered an issue\.$"):
        policy.generate_batch([[1, 2, 3]], seeds=[0])
    fake_vllm["generate"] = AttributeError("'list' object has no attribute 'prompt_token_ids'")
    with pytest.raises(AttributeError, match="prompt_token_ids"):
        policy.generate_batch([[1, 2, 3]], seeds=[0])


def _rollout(*args: str):
    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    return CliRunner().invoke(app, ["rollout", "--env", "vault", "--suite", "recall-2", "--n", "1", "--no-progress",
                                    *args])


@pytest.fixture(scope="module")
def kit_8k(kit, tmp_path_factory) -> Path:
    """A kit model of 8,192 positions (the default kit has 65,536): the window the rollout's defaults make."""
    from memorywalker.modelkit.build import build_model

    return build_model(tmp_path_factory.mktemp("kit-8k") / "model", kit[0], max_positions=8192)


def test_rollout_default_window_fits_the_models_positions(fake_vllm, kit_8k, tmp_path):
    """A model of 8192 positions. By default ``--max-context`` is 8192 − ``--max-new-tokens`` 256 =
    7936, so the engine's window is 7936 + 256 = 8192 (before: 8192 + 256 = 8448, which vLLM refuses:
    "max_model_len (8448) is greater than the derived max_model_len"). The stand-in engine then fails to
    start, which is one line, exit 2."""
    fake_vllm["start"] = RuntimeError("stand-in engine: not started")
    res = _rollout("--sampler", f"vllm:{kit_8k}", "-o", str(tmp_path / "x.jsonl"))
    assert fake_vllm["kwargs"]["max_model_len"] == 8192
    assert res.exit_code == 2 and "not started" in res.output


def test_rollout_window_past_the_models_positions_names_the_flag(fake_vllm, kit_8k, tmp_path):
    """``--max-context 8192`` given on a model of 8192 positions: refused before any engine starts, in
    one line naming the flag and the largest value that fits (8192 − 256 = 7936); likewise a
    ``--max-model-len`` past the positions."""
    res = _rollout("--sampler", f"vllm:{kit_8k}", "--max-context", "8192", "-o", str(tmp_path / "x.jsonl"))
    assert res.exit_code == 2 and "kwargs" not in fake_vllm, res.output
    line = " ".join(res.output.split())
    assert "--max-context 8192 + --max-new-tokens 256 = 8448 exceeds the 8192 positions of" in line, line
    assert "lower --max-context to 7936 or less" in line, line
    res = _rollout("--sampler", f"vllm:{kit_8k}", "--max-model-len", "9000", "-o", str(tmp_path / "x.jsonl"))
    line = " ".join(res.output.split())
    assert res.exit_code == 2 and "--max-model-len 9000 exceeds the 8192 positions of" in line, line
