"""Samplers: who writes a response. Shared by :mod:`memorywalker.rollout` and the gateway; imports
records and render, never rollout.

* ``hf:DIR`` — a local transformers causal LM in this process (:mod:`memorywalker.samplers.hf`).
* ``vllm:DIR`` — a vLLM engine in this process (:mod:`memorywalker.samplers.vllm`): token-id prompts,
  many episodes' calls in one ``generate``, and the RL recipe's weight sync.
* ``openai:URL`` — an OpenAI-compatible completions server, vLLM or SGLang
  (:mod:`memorywalker.samplers.openai`, over :mod:`memorywalker.samplers.http`).
* scripted — e.g. rollout's ``expert`` (:mod:`memorywalker.rollout.environments.websearch.expert`), which returns a structured
  message that the harness renders with the chat template, so its episodes are ordinary training data.

All speak :mod:`memorywalker.samplers.base`: a :class:`~memorywalker.samplers.base.PolicyRequest` whose
``prompt_ids`` are exactly the rendered context, a :class:`~memorywalker.samplers.base.PolicyOutput` back.
Nothing is imported here: ``import memorywalker.samplers.hf`` (torch, transformers on first use) and the
others load only what they need. ``rollout.episodes.backends.make_policy`` builds one by name.
"""
