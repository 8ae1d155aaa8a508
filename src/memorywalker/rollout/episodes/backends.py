"""The policy backends by name: ``make_policy("hf:DIR")`` and the other kinds of :data:`BACKENDS`."""

from __future__ import annotations

from typing import Any

from memorywalker.errors import InputError
from memorywalker.rollout.environments.base import Environment
from memorywalker.samplers.base import Policy
from memorywalker.samplers.hf import HFPolicy
from memorywalker.samplers.openai import OpenAIPolicy
from memorywalker.samplers.vllm import VLLMPolicy  # vLLM itself is imported when an engine starts

# kind -> what follows "kind:" in a spec ("" = nothing)
BACKENDS = {"expert": "", "hf": "MODEL_DIR", "openai": "URL", "vllm": "MODEL_DIR"}
SPECS = " | ".join(f"{kind}:{arg}" if arg else kind for kind, arg in BACKENDS.items())


def make_policy(spec: str, *, env: Environment | None = None, **kwargs: Any) -> Policy:
    """``expert`` | ``hf:DIR`` | ``openai:URL`` | ``vllm:DIR`` → a policy. Extra keyword arguments go to its constructor.

    ``expert`` is the scripted expert of ``env`` (its ``expert()``); an environment without one of its own
    raises, and so does ``expert`` without an environment.
    """
    kind, _, arg = spec.partition(":")
    if kind == "expert" and not arg:
        if env is None:
            raise ValueError("the expert is an environment's: make_policy('expert', env=...)")
        return env.expert()
    if kind == "hf" and arg:
        return HFPolicy(arg, **kwargs)
    if kind == "openai" and arg:
        return OpenAIPolicy(arg, **kwargs)
    if kind == "vllm" and arg:
        return VLLMPolicy(arg, **kwargs)
    raise InputError(f"unknown policy {spec!r}; valid: {SPECS}")
