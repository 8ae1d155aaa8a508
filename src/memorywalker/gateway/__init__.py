"""The recording gateway: an HTTP server real harnesses (Claude Code, Codex CLI, OpenCode) talk to.

It speaks Anthropic Messages, OpenAI Responses and OpenAI Chat Completions
(:mod:`.anthropic`, :mod:`.responses`, :mod:`.chat`), renders each request once with the served
model's chat template, asks a sampler (:mod:`.backends`) for the response, and records the call token
for token (:mod:`.core`, :mod:`.journal`); sessions become trajectories whose branches are classified
(:mod:`.trajectory`). :mod:`.harnesses` knows how to point each harness at it and run one.
It never imports ``rollout/``: samplers live in :mod:`memorywalker.samplers`.
"""
