"""Which failures of the ``vllm`` sampler are the engine's (an :class:`EngineError`: one line, exit 2 like
an unreachable endpoint) and which are ours (a ``TypeError`` / ``AttributeError`` from a bad argument:
raised as what it is, so the CLI reports a bug with its traceback). No engine starts: ``vllm`` is a
stand-in module whose ``LLM`` raises what vLLM would, so this runs in the default suite."""

from __future__ import annotations

import sys
import types

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
