"""The policy backends by name: ``make_policy("hf:DIR")`` and the other kinds of :data:`BACKENDS`."""

from __future__ import annotations

from typing import Any

from memorywalker.rollout.expert import ExpertPolicy
from memorywalker.samplers.base import Policy
from memorywalker.samplers.hf import HFPolicy
from memorywalker.samplers.openai import OpenAIPolicy
from memorywalker.samplers.vllm import VLLMPolicy  # vLLM itself is imported when an engine starts

# kind -> what follows "kind:" in a spec ("" = nothing)
BACKENDS = {"expert": "", "hf": "MODEL_DIR", "openai": "URL", "vllm": "MODEL_DIR"}
SPECS = " | ".join(f"{kind}:{arg}" if arg else kind for kind, arg in BACKENDS.items())


def make_policy(spec: str, *, env=None, **kwargs: Any) -> Policy:
    """``expert`` | ``hf:DIR`` | ``openai:URL`` | ``vllm:DIR`` → a policy. Extra keyword arguments go to its constructor.

    ``expert`` is the scripted expert of ``env`` (its ``expert()``), the web-search expert by default.
    """
    kind, _, arg = spec.partition(":")
    if kind == "expert" and not arg:
        return env.expert() if env is not None and hasattr(env, "expert") else ExpertPolicy()
    if kind == "hf" and arg:
        return HFPolicy(arg, **kwargs)
    if kind == "openai" and arg:
        return OpenAIPolicy(arg, **kwargs)
    if kind == "vllm" and arg:
        return VLLMPolicy(arg, **kwargs)
    raise ValueError(f"unknown policy {spec!r}; valid: {SPECS}")
